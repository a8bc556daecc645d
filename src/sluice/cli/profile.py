"""``sluice profile show|reset``: the memory each task's runs were observed to use."""

from __future__ import annotations

import click
from rich.table import Table

from sluice.cli.common import app_option, broker_client, console
from sluice.tasks import memory_profile
from sluice.units import format_size

_app_option = app_option("App whose broker to use (default: the configured one).")


@click.group("profile")
def profile_group() -> None:
    """Observed memory per task (the watchdog's peak of every run), which `memory="auto"` learns from.

    \b
      sluice profile show              every observed task: runs, p50, p95, peak, kills
      sluice profile reset TASK        forget a task's runs (it relearns from the next ones)
    """


@profile_group.command("show")
@click.argument("task", required=False)
@_app_option
def show(task: str | None, app_name: str | None) -> None:
    """Runs observed, p50, p95 and peak memory, and memory kills, per task (or for TASK)."""
    client = broker_client(app_name).client
    names = [task] if task else memory_profile.observed_tasks(client)
    table = Table(title="observed memory")
    for column in ("task", "runs", "p50", "p95", "peak", "kills"):
        table.add_column(column, justify="left" if column == "task" else "right")
    for name in names:
        found = memory_profile.read(client, name)
        table.add_row(
            name,
            str(found.count),
            format_size(found.p50),
            format_size(found.p95),
            format_size(found.peak),
            str(found.kills),
        )
    console.print(table)


@profile_group.command("reset")
@click.argument("task")
@_app_option
def reset(task: str, app_name: str | None) -> None:
    """Forget TASK's observed runs: a `memory="auto"` task runs at the default memory again until it
    has enough new ones."""
    if memory_profile.reset(broker_client(app_name).client, task):
        click.echo(f"reset the memory profile of {task}")
    else:
        raise click.ClickException(f"no memory profile for {task!r}; `sluice profile show` lists the observed tasks")
