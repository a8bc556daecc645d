"""``sluice compute task.py``: run a task file's plan()/execute() over workers with a durable sink
(the run itself is :mod:`sluice.client.batch.launch`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from sluice.errors import ConfigurationError
from sluice.tenants import check_tenant


@click.command(context_settings={"ignore_unknown_options": False})
@click.argument("task_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("task_args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--check",
    "check_items",
    is_flag=False,
    flag_value=3,
    type=int,
    default=None,
    help="Run plan() and execute() in this process on the first N items (default 3); no broker needed.",
)
@click.option("-w", "--workers", type=int, default=None, help="Start N local workers on a run-private queue.")
@click.option("--per-worker", type=int, default=1, show_default=True, help="Concurrent slots per local worker.")
@click.option(
    "--python",
    "python",
    default=sys.executable,
    show_default="this Python",
    help="Interpreter for local workers (it must have sluice installed).",
)
@click.option(
    "--retries",
    type=int,
    default=0,
    show_default=True,
    help="Infrastructure retries (worker lost, killed); business failures are never retried.",
)
@click.option(
    "--results",
    "results_mode",
    type=click.Choice(["ndjson", "summary", "quiet"]),
    default="summary",
    show_default=True,
    help="ndjson: every record on stdout as it lands; summary: counts at the end.",
)
@click.option(
    "--sink",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory for ready.ndjson, failures.ndjson and checkpoint.json (durable results).",
)
@click.option("--resume", is_flag=True, help="Skip ids already in the sink (ready, and failed ones).")
@click.option("--rerun-failed", is_flag=True, help="With --resume: run the ids recorded as failed again.")
@click.option("--observe", is_flag=True, help="Show live progress (a plain line per interval when not a terminal).")
@click.option(
    "--traj", is_flag=True, help="Also write the results as a Lance dataset, <sink>/results.lance (needs pylance)."
)
@click.option("--broker", default=None, help="Redis URL (default: SLUICE_BROKER_URL, else an embedded Redis).")
@click.option("--run-id", default=None, help="Name of the run (default: derived from --sink, so --resume finds it).")
@click.option(
    "--quarantine-after",
    type=int,
    default=3,
    show_default=True,
    help="Stop sending items to a worker after this many infrastructure failures on it.",
)
@click.option(
    "--tenant",
    default=None,
    callback=lambda ctx, param, value: None if value is None else _tenant(value),
    help="The tenant the run's items belong to, for a class shared by tenants (default: SLUICE_TENANT, "
    'else the default tenant); see the README\'s "Sharing a class".',
)
@click.option(
    "--keep",
    is_flag=True,
    help="Keep the run's directory (and a default sink) past run_ttl; its Redis data expires anyway.",
)
def compute(
    task_file: Path,
    task_args: tuple[str, ...],
    check_items: int | None,
    workers: int | None,
    per_worker: int,
    python: str,
    retries: int,
    results_mode: str,
    sink: Path | None,
    resume: bool,
    rerun_failed: bool,
    observe: bool,
    traj: bool,
    broker: str | None,
    run_id: str | None,
    quarantine_after: int,
    tenant: str | None,
    keep: bool,
) -> None:
    """Run TASK_FILE's plan() items through execute() on workers. Arguments after `--` go to the
    file's own argparse, exactly as `python TASK_FILE ...` would get them.

    \b
      sluice compute task.py --check -- --n 2
      sluice compute task.py -w 4 --sink /tmp/run1 -- --n 1000
      sluice compute task.py -w 4 --sink /tmp/run1 --resume --observe -- --n 1000
      torchrun --nproc_per_node=2 --no-python -- sluice compute task.py --sink /tmp/run2 -- --n 1000

    Exit codes: 0 every item succeeded, 1 some failed, 130 interrupted (Ctrl-C), 2 usage,
    75 lost the broker for over two minutes (nothing failed: run again with --resume).
    """
    from sluice.client.batch import launch  # CLI start-up: the batch driver, kombu's transport (~80 ms)
    from sluice.tasks.batch.taskfile import TaskFile  # CLI start-up: launch's own import, so free here

    tf = TaskFile.load(task_file, list(task_args))
    if check_items is not None:
        sys.exit(launch.check(tf, check_items))
    options = launch.RunOptions(
        workers,
        per_worker,
        python,
        retries,
        results_mode,
        resume,
        rerun_failed,
        observe,
        quarantine_after,
        tenant,
    )
    sys.exit(launch.run_task_file(tf, options, sink, broker, run_id, keep, traj))


def _tenant(name: str) -> str:
    """``--tenant``, checked before anything starts (a usage error naming it)."""
    try:
        return check_tenant(name)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--tenant") from None
