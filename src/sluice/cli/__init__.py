"""The ``sluice`` command (click, as Celery's own command is)."""

from __future__ import annotations

import signal
import socket
import sys
import time
from typing import Any, NamedTuple

import click
import redis
from celery.app.utils import find_app
from rich.markup import escape
from rich.table import Table

from sluice import redis_client, terminal
from sluice.app import App
from sluice.cli.dead_letters import dead_letters_group
from sluice.cli.deploy import autoscale, deploy, metrics
from sluice.cli.profile import profile_group
from sluice.cli.runs import runs_group
from sluice.client.batch.launch import compute
from sluice.compute import Compute
from sluice.config import Settings, embedded_broker_url, fallback_memory
from sluice.errors import NoQueueFits, SluiceError
from sluice.units import format_size
from sluice.queues.catalog import Catalog
from sluice.workers.gpu import gpu_count

console = terminal.console()


def load_app(name: str) -> App:
    """Import ``module`` or ``module:attr`` and return the sluice App in it."""
    try:
        app = find_app(name)
    except Exception as exc:  # find_app raises anything the import raises
        raise click.BadParameter(f"cannot load app {name!r}: {exc}", param_hint="-A/--app") from exc
    if not isinstance(app, App):
        raise click.BadParameter(f"{name!r} holds a {type(app).__name__}, not a sluice.App", param_hint="-A/--app")
    return app


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """sluice: a Celery + Redis task queue that routes each task to the smallest resource class
    (queue) that fits the compute it declares.

    \b
    Start here:
      sluice demo                 run the demo on an embedded Redis and local workers
      sluice up                   run Redis, one worker per class and Flower locally
      sluice worker -A APP -q C   run a worker for one resource class
      sluice status               queue depth, workers and running tasks per class
      sluice explain -A APP       where each task of an app is routed, and why
      sluice dead-letters list    messages workers could not run, kept with the reason
      sluice compute task.py -w 4 run plan()/execute() over workers with a durable sink
      sluice runs                 batch runs, what they take in Redis and on disk, when it expires
      sluice deploy render        Kubernetes manifests for the catalog
    """


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("-A", "--app", "app_name", required=True, help="Module (or module:attr) holding the sluice App.")
@click.option("-q", "--queue", "queues", multiple=True, help="Resource class to serve (repeatable). Default: the smallest.")
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
        raise click.UsageError(f"class {', '.join(gpu)} needs a GPU and none is visible here; "
                               "run on a GPU node or pass --allow-no-gpu for development")
    argv = ["worker", "-Q", ",".join(queues), "--loglevel", loglevel, *ctx.args]
    app.worker_main(argv + (["--allow-no-gpu"] if allow_no_gpu else []))


@main.command()
@click.option("-A", "--app", "app_name", default="sluice.demo", show_default=True,
              help="Module holding the sluice App the workers serve: give your own (-A myapp.tasks), or the "
                   "workers discard its tasks as unregistered.")
@click.option("--allow-no-gpu", is_flag=True, help="Start the gpu class workers even without a GPU.")
@click.option("--no-flower", is_flag=True, help="Do not start Flower.")
@click.option("--flower-port", type=int, default=None, help="Flower's port (default: a free one).")
def up(app_name: str, allow_no_gpu: bool, no_flower: bool, flower_port: int | None) -> None:
    """Run the whole topology locally: Redis (unless SLUICE_BROKER_URL is set), one worker per
    resource class and Flower. It prints `export` lines (the broker URL and the secret that signs
    remote calls): pasted into another shell, they point apps, `sluice compute` and
    `@sluice.remote` functions there at this cluster. What dies is started again (Redis at once,
    workers and Flower with a backoff of 1 s doubling to 60 s). Ctrl-C, SIGTERM or SIGHUP (the
    terminal closing) stops everything it started. One `sluice up` per SLUICE_HOME."""
    from sluice.deploy.local import LocalCluster

    settings = Settings.load()
    app = load_app(app_name)
    cluster = LocalCluster(app_name, settings, list(app.catalog), allow_no_gpu=allow_no_gpu, flower=not no_flower,
                           flower_port=flower_port, broker_url=settings.broker_url)
    stopping: list[int] = []   # the signals received; a handler takes no lock the main loop may hold

    def on_signal(signum: int, _frame: Any) -> None:
        if stopping and signum == signal.SIGINT:
            say("[red]second interrupt: exiting now[/red]")
            raise SystemExit(130)
        stopping.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):   # SIGHUP: the terminal closed
        signal.signal(signum, on_signal)
    with console.status("starting redis, workers and flower"):
        cluster.start()
    _print_up(cluster)
    while not stopping:
        time.sleep(0.5)
        for line in cluster.supervise():
            say(f"[yellow]{line}[/yellow]")
    say("stopping: warm shutdown of workers (running tasks finish), then redis")
    cluster.stop()
    say("stopped")


def say(line: str) -> None:
    """Print a line, or nothing once the terminal is gone (after SIGHUP the shutdown goes on)."""
    try:
        console.print(line)
    except OSError:
        pass


def _print_up(cluster: Any) -> None:
    console.print("[bold green]sluice is up[/bold green]")
    console.print(f"  app      {cluster.app_module}" + ("  (the demo app: give -A yourapp.tasks to serve your own)"
                                                        if cluster.app_module == "sluice.demo" else ""))
    console.print(f"  broker   {cluster.broker_url}")
    if cluster.flower_url:
        console.print(f"  flower   {cluster.flower_url}  (user {cluster.flower_user}, "
                      f"password {cluster.flower_password})")
    for child in cluster.children:
        console.print(f"  {child.name:<16} pid {child.process.pid}  log {child.log_path}")
    for name, why in cluster.skipped.items():
        console.print(f"  [yellow]worker-{name}: not started: {why}[/yellow]")
    console.print("\nPoint an app or client at it (paste into a shell):")
    for key, value in cluster.env().items():
        click.echo(f"export {key}={value}")
    console.print("\nCtrl-C stops everything.")


class Broker(NamedTuple):
    """What the read-only commands need: Redis, the classes, and the rest of the settings."""

    client: redis.Redis
    catalog: Catalog
    settings: Settings


def broker_client(app_name: str | None) -> Broker:
    """Redis and the settings of ``app_name``, or the configured ones (a running ``sluice up``)."""
    if app_name:
        app = load_app(app_name)
        return Broker(app.redis, app.catalog, app.settings)
    settings = Settings.load()
    url = settings.broker_url or embedded_broker_url(settings.home)
    if not url:
        raise click.ClickException("no broker: set SLUICE_BROKER_URL or start one with `sluice up`")
    return Broker(redis_client.connect(url, wait_out_outages=False, socket_timeout=5), settings.catalog, settings)


@main.command()
@click.option("-A", "--app", "app_name", default=None, help="App whose catalog to use (default: the configured one).")
def status(app_name: str | None) -> None:
    """Per resource class: queue depth, workers online, tasks running, slot size, and the tasks
    of the cluster's task catalog it serves; then the intake queue (plain Celery clients' tasks
    waiting to be forwarded)."""
    from sluice.queues import task_catalog
    from sluice.queues.status import class_status, intake_status, tasks_by_class

    broker = broker_client(app_name)
    try:
        rows = class_status(broker.client, broker.catalog)
        intake = intake_status(broker.client, broker.settings.intake_queue)
        serves = tasks_by_class(task_catalog.read(broker.client), broker.catalog)
    except redis.RedisError as exc:
        raise click.ClickException(f"cannot read the broker: {exc}") from None
    table = Table(title="sluice status")
    for column in ("class", "queued", "workers", "running", "slots", "slot size", "tasks"):
        table.add_column(column, justify="left" if column in ("class", "slot size", "tasks") else "right")
    for row in rows:
        name = row.resource_class.name
        table.add_row(name, str(row.queued), str(row.workers), str(row.running), str(row.slots),
                      row.resource_class.slot.describe(), ", ".join(serves.get(name, [])) or "-")
    table.add_row(f"{intake.queue} (intake)", str(intake.queued), str(intake.workers), "-", "-", "-",
                  "forwarded to the class that fits")
    console.print(table)
    if serves.get("?"):
        console.print(f"[yellow]no class here holds[/yellow] {', '.join(serves['?'])}")


@main.command()
@click.option("-A", "--app", "app_name", default=None,
              help="Module (or module:attr) holding the sluice App. Without it, the tasks come from the cluster's "
                   "task catalog (what running workers registered) and the classes from the settings.")
@click.option("--from-cluster", is_flag=True,
              help="With -A: read the tasks from the cluster's task catalog instead of the app's code "
                   "(the app's classes still route them).")
def explain(app_name: str | None, from_cluster: bool) -> None:
    """For each task: declared compute, effective compute, retry policy, the class it routes to,
    and the memory its runs were observed to use (p50/p95/peak, runs), flagged when the declared
    memory is over twice the p95 (over-provisioned) or runs were killed for memory."""
    from sluice.queues import task_catalog
    from sluice.tasks import memory_profile

    from_code = bool(app_name) and not from_cluster
    if from_code:
        app = load_app(str(app_name))
        broker = Broker(redis_client.connect(app.conf.broker_url, wait_out_outages=False, socket_timeout=2),
                        app.catalog, app.settings)
        entries = task_catalog.entries_of(app, "this code")
    else:
        broker = broker_client(app_name)
        try:
            entries = list(task_catalog.read(broker.client).values())
        except redis.RedisError as exc:
            raise click.ClickException(f"cannot read the broker: {exc}") from None
        if not entries:
            raise click.ClickException("the task catalog is empty: no sluice worker has started against this "
                                       "broker yet (give -A to read an app's code instead)")
    table = Table(title=f"routing for {app_name}" if from_code else "routing of the cluster's task catalog")
    for column in ("task", "declared", "effective", "retry", "class", "observed p50/p95/peak (runs)", "flag",
                   *(() if from_code else ("published by",))):
        table.add_column(column)
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            observed = memory_profile.read(broker.client, entry.name)
        except redis.RedisError:
            observed = None
        effective = memory_profile.with_learned_memory(
            entry.effective, observed or memory_profile.EMPTY, broker.settings,
            entry.fallback or fallback_memory(Compute(), broker.settings))
        try:
            where = broker.catalog.route(effective, entry.name).name
        except NoQueueFits:
            where = "[red]no class fits[/red]"
        cells = [entry.name, entry.declared.describe() if entry.declared else "(default)", effective.describe(),
                 entry.retry.describe() if entry.retry is not None else "-", where, *_observed(observed, effective)]
        if not from_code:
            cells.append(f"{entry.worker}, {format_age(time.time() - entry.at)} ago")
        table.add_row(*cells)
    console.print(table)
    console.print("classes, smallest first: " + "; ".join(rc.describe() for rc in broker.catalog))


def _observed(profile: Any, effective: Any) -> tuple[str, str]:
    """The observed-memory and flag cells of `sluice explain`."""
    if profile is None or not profile.count:
        return "-", ""
    sizes = "/".join(format_size(v) for v in (profile.p50, profile.p95, profile.peak))
    flags = []
    if effective.memory_bytes and effective.memory_bytes > 2 * profile.p95:
        flags.append("over-provisioned")
    if profile.kills:
        flags.append(f"under-provisioned: {profile.kills} memory kill(s)")
    return f"{sizes} ({profile.count})", ", ".join(flags)


def format_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


@main.command()
@click.option("--worker", "hostname", required=True,
              help="The worker's name, as given to -n (%h expands to this machine's hostname).")
def check(hostname: str) -> None:
    """Health probe: exit 0 if the worker's heartbeat is fresh; 3 no heartbeat, 4 stale, 5 broker
    unreachable (2 is a usage error)."""
    from sluice.workers.health import check_worker

    settings = Settings.load()
    client = broker_client(None).client
    health, reason = check_worker(client, hostname.replace("%h", socket.gethostname()), settings.heartbeat_interval)
    click.echo(f"{health.name}: {reason}")
    sys.exit(int(health))


@main.command()
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait for the demo's results.")
def demo(timeout: float) -> None:
    """Start an embedded Redis and one worker per class, submit a cpu, a highmem and a gpu task
    with .delay(), and print where each one ran. The demo keeps its Redis and logs apart from
    `sluice up`'s (in SLUICE_HOME/demo), so it can run beside it."""
    from sluice import demo as demo_app
    from sluice.deploy.local import LocalCluster

    settings = Settings.load()
    no_gpu = gpu_count() == 0
    cluster = LocalCluster("sluice.demo", settings, list(demo_app.app.catalog), allow_no_gpu=no_gpu, flower=False,
                           broker_url=settings.broker_url, state_dir=settings.home / "demo", owner="sluice demo")
    if no_gpu:
        console.print("[yellow]no GPU here: the demo's gpu worker runs with --allow-no-gpu[/yellow]")
    with console.status("starting redis and one worker per class"):
        cluster.start()
    try:
        demo_app.app.conf.broker_url = demo_app.app.conf.result_backend = cluster.broker_url
        pending = [(task, task.delay(*args)) for task, args in demo_app.SUBMISSIONS]
        table = Table(title="sluice demo")
        for column in ("task", "compute", "queue", "worker", "value"):
            table.add_column(column)
        with console.status("waiting for results"):
            for task, result in pending:
                out = result.get(timeout=timeout)
                table.add_row(task.name.rsplit(".", 1)[-1], task.effective_compute.describe(), out["queue"],
                              out["worker"], str(out["value"]))
        console.print(table)
    finally:
        cluster.stop()


main.add_command(compute)
main.add_command(runs_group)
main.add_command(deploy)
main.add_command(autoscale)
main.add_command(metrics)
main.add_command(dead_letters_group)
main.add_command(profile_group)


def run() -> None:
    """Entry point with sluice errors shown as one line instead of a traceback."""
    try:
        main()
    except SluiceError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        sys.exit(exc.exit_code)
