"""``sluice up`` and ``sluice demo``: the whole topology on this machine, kept running for an app
or run once for the demo."""

from __future__ import annotations

import signal
import time
from typing import Any

import click
from rich.table import Table

from sluice.cli.common import app_option, console, load_app
from sluice.config import Settings
from sluice.deploy.local import LocalCluster
from sluice.workers.gpu import gpu_count


@click.command()
@app_option(
    "Module holding the sluice App the workers serve: give your own (-A myapp.tasks), or the "
    "workers discard its tasks as unregistered.",
    default="sluice.demo",
)
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
    settings = Settings.load()
    app = load_app(app_name)
    cluster = LocalCluster(
        app_name,
        settings,
        list(app.catalog),
        allow_no_gpu=allow_no_gpu,
        flower=not no_flower,
        flower_port=flower_port,
        broker_url=settings.broker_url,
    )
    stopping: list[int] = []  # the signals received; a handler takes no lock the main loop may hold

    def on_signal(signum: int, _frame: Any) -> None:
        if stopping and signum == signal.SIGINT:
            say("[red]second interrupt: exiting now[/red]")
            raise SystemExit(130)
        stopping.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal closed
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


def _print_up(cluster: LocalCluster) -> None:
    console.print("[bold green]sluice is up[/bold green]")
    console.print(
        f"  app      {cluster.app_module}"
        + ("  (the demo app: give -A yourapp.tasks to serve your own)" if cluster.app_module == "sluice.demo" else "")
    )
    console.print(f"  broker   {cluster.broker_url}")
    if cluster.flower_url:
        console.print(
            f"  flower   {cluster.flower_url}  (user {cluster.flower_user}, password {cluster.flower_password})"
        )
    for child in cluster.children:
        console.print(f"  {child.name:<16} pid {child.process.pid}  log {child.log_path}")
    for name, why in cluster.skipped.items():
        console.print(f"  [yellow]worker-{name}: not started: {why}[/yellow]")
    console.print("\nPoint an app or client at it (paste into a shell):")
    for key, value in cluster.env().items():
        click.echo(f"export {key}={value}")
    console.print("\nCtrl-C stops everything.")


@click.command()
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait for the demo's results.")
def demo(timeout: float) -> None:
    """Start an embedded Redis and one worker per class, submit a cpu, a highmem and a gpu task
    with .delay(), and print where each one ran. The demo keeps its Redis and logs apart from
    `sluice up`'s (in SLUICE_HOME/demo), so it can run beside it."""
    from sluice import demo as demo_app  # CLI start-up: the demo app declares its tasks (~50 ms)

    settings = Settings.load()
    no_gpu = gpu_count() == 0
    cluster = LocalCluster(
        "sluice.demo",
        settings,
        list(demo_app.app.catalog),
        allow_no_gpu=no_gpu,
        flower=False,
        broker_url=settings.broker_url,
        state_dir=settings.home / "demo",
        owner="sluice demo",
    )
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
                table.add_row(
                    task.name.rsplit(".", 1)[-1],
                    task.effective_compute.describe(),
                    out["queue"],
                    out["worker"],
                    str(out["value"]),
                )
        console.print(table)
    finally:
        cluster.stop()
