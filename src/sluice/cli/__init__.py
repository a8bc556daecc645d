"""The ``sluice`` command (click, as Celery's own command is): the root group, each command group
from its own module, and the entry point that shows a sluice error as one line."""

from __future__ import annotations

import sys

import click
import redis
from rich.markup import escape

from sluice import terminal
from sluice.cli.compute import compute
from sluice.cli.dead_letters import dead_letters_group
from sluice.cli.deploy import deploy
from sluice.cli.local import demo, up
from sluice.cli.profile import profile_group
from sluice.cli.revoke import revoke
from sluice.cli.runs import runs_group
from sluice.cli.scaling import autoscale, metrics
from sluice.cli.status import explain, status
from sluice.cli.worker import check, worker
from sluice.errors import SluiceError


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


for command in (
    worker,
    up,
    status,
    explain,
    check,
    demo,
    compute,
    runs_group,
    deploy,
    autoscale,
    metrics,
    dead_letters_group,
    profile_group,
    revoke,
):
    main.add_command(command)


def run() -> None:
    """Entry point with sluice errors shown as one line on stderr instead of a traceback."""
    try:
        main()
    except SluiceError as exc:
        terminal.console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except redis.RedisError as exc:  # a command that reads the broker, which did not answer
        terminal.console(stderr=True).print(
            f"[red]error:[/red] cannot reach the broker: {escape(str(exc))}", soft_wrap=True
        )
        sys.exit(1)
