"""``sluice revoke ID...``: revoke tasks so that no worker starts them, live, offline or restarted."""

from __future__ import annotations

import click

from sluice.app import App
from sluice.cli.common import app_option, console, load_app
from sluice.queues.revokes import keep_seconds


@click.command()
@app_option("App whose broker and result settings to use (default: the configured one).")
@click.option(
    "--terminate",
    is_flag=True,
    help="Also stop a revoked task that is running now (its pool process is killed; it ends REVOKED, not retried).",
)
@click.argument("task_ids", nargs=-1, required=True)
def revoke(app_name: str | None, terminate: bool, task_ids: tuple[str, ...]) -> None:
    """Revoke tasks by id. Each id is recorded in Redis for as long as results are kept, so no
    worker ever starts the task, including one that is offline or restarts later (Celery's own
    revoke lives only in the memory of the workers up when it is sent); the live workers hear it
    at once, as from `celery control revoke`. A revoked task ends REVOKED (Flower shows it so).

    \b
      sluice revoke 2f9c...                    never start it
      sluice revoke --terminate 2f9c... 7a1e...   and stop it if it runs now
    """
    app = load_app(app_name) if app_name else App.default()
    app.control.revoke(list(task_ids), terminate=terminate)
    hours = keep_seconds(app) / 3600
    console.print(
        f"revoked {len(task_ids)} task(s): recorded for {hours:g} h (as long as results are kept)"
        + ("; a running one is stopped" if terminate else "")
    )
