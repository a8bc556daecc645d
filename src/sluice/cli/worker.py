"""``sluice worker`` (a Celery worker for resource classes) and ``sluice check`` (its health
probe): the two commands a worker's container runs."""

from __future__ import annotations

import socket
import sys

import click

from sluice.cli.common import app_option, broker_client, load_app
from sluice.errors import SluiceError
from sluice.workers.gpu import gpu_count
from sluice.workers.health import check_worker


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@app_option("Module (or module:attr) holding the sluice App.", required=True)
@click.option(
    "-q", "--queue", "queues", multiple=True, help="Resource class to serve (repeatable). Default: the smallest."
)
@click.option("--allow-no-gpu", is_flag=True, help="Serve a gpu class on a machine without a GPU (development only).")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@click.pass_context
def worker(ctx: click.Context, app_name: str, queues: tuple[str, ...], allow_no_gpu: bool, loglevel: str) -> None:
    """Run a Celery worker for resource classes, with concurrency = the class's slots.

    Equivalent to `celery -A APP worker -Q CLASS`; any further option is passed to Celery
    (for example `-c 2` to override the slots, or `-n name@%h`).
    """
    app = load_app(app_name)
    queues = queues or (app.catalog.default_class.name,)
    try:
        classes = [app.catalog.get(q) for q in queues]
    except SluiceError as exc:
        raise click.BadParameter(str(exc), param_hint="--queue") from None
    gpu = [rc.name for rc in classes if rc.is_gpu]
    if gpu and not allow_no_gpu and gpu_count() == 0:
        raise click.UsageError(
            f"class {', '.join(gpu)} needs a GPU and none is visible here; "
            "run on a GPU node or pass --allow-no-gpu for development"
        )
    argv = ["worker", "-Q", ",".join(queues), "--loglevel", loglevel, *ctx.args]
    app.worker_main(argv + (["--allow-no-gpu"] if allow_no_gpu else []))


@click.command()
@click.option(
    "--worker",
    "hostname",
    required=True,
    help="The worker's name, as given to -n (%h expands to this machine's hostname).",
)
def check(hostname: str) -> None:
    """Health probe: exit 0 if the worker's heartbeat is fresh; 3 no heartbeat, 4 stale, 5 broker
    unreachable (2 is a usage error)."""
    broker = broker_client(None)
    health, reason = check_worker(
        broker.client, hostname.replace("%h", socket.gethostname()), broker.settings.heartbeat_interval
    )
    click.echo(f"{health.name}: {reason}")
    sys.exit(int(health))
