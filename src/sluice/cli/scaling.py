"""``sluice autoscale`` (sluice's own autoscaler, for clusters without KEDA) and ``sluice metrics``
(the per-class figures it scales on, served to Prometheus)."""

from __future__ import annotations

import time

import click

from sluice.cli.common import app_option, broker_client, configured_broker_url, load_app
from sluice.deploy import kube_client


@click.command()
@app_option("Module holding the sluice App.", required=True)
@click.option("--namespace", default="sluice", show_default=True)
@click.option("--interval", default=5.0, show_default=True, help="Seconds between reconciliations.")
@click.option("--cooldown", default=60.0, show_default=True, help="Seconds after a change before scaling down.")
@click.option("--max-step-up", default=10, show_default=True)
@click.option("--max-step-down", default=2, show_default=True)
@click.option("--metrics-port", default=9100, show_default=True, help="Serve Prometheus /metrics here (0: off).")
def autoscale(
    app_name: str,
    namespace: str,
    interval: float,
    cooldown: float,
    max_step_up: int,
    max_step_down: int,
    metrics_port: int,
) -> None:
    """Scale each class's worker Deployment on its queue, draining idle workers before scaling down
    (for clusters without KEDA)."""
    api = kube_client.connect("sluice autoscale")
    from kubernetes import client  # the kubernetes extra, once connect has said whether it is installed

    from sluice.deploy.autoscaler import Autoscaler  # the kubernetes extra (it imports the client)
    from sluice.deploy.metrics import serve  # CLI start-up: prometheus_client (~17 ms)

    app = load_app(app_name)
    with kube_client.reaching(api):  # a cluster that does not answer now is an error, later only a log line
        client.CoreV1Api(api).list_namespaced_pod(namespace, limit=1)
    if metrics_port:
        serve(app.redis, app.catalog, metrics_port, intake=app.settings.intake_queue, settings=app.settings)
    Autoscaler(
        app.redis,
        app.catalog,
        client.AppsV1Api(api),
        client.CoreV1Api(api),
        namespace,
        app.control,
        interval=interval,
        cooldown=cooldown,
        max_step_up=max_step_up,
        max_step_down=max_step_down,
    ).run()


@click.command()
@app_option("App whose catalog to report (default: configured).")
@click.option("--port", default=9100, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True)
def metrics(app_name: str | None, port: int, address: str) -> None:
    """Serve Prometheus metrics: per class (queued, reserved, running, workers, escalations, memory
    kills), per tenant and limit, and per task, counted from Celery's events under celery-exporter's
    names (sent, started, succeeded, failed, retried, ... and runtime; workers started with -E),
    with the wait from publish to start, for docker-compose, Kubernetes or local use."""
    from sluice import App
    from sluice.deploy.metrics import serve  # CLI start-up: prometheus_client (~17 ms)

    broker = broker_client(app_name)
    url = configured_broker_url(broker.settings)
    events_app = load_app(app_name) if app_name else App("sluice.metrics", broker=url)
    serve(
        broker.client,
        broker.catalog,
        port,
        address,
        intake=broker.settings.intake_queue,
        events_app=events_app,
        task_names=broker.settings.metrics_task_names,
        settings=broker.settings,
    )
    click.echo(f"serving http://{address}:{port}/metrics")
    while True:
        time.sleep(3600)
