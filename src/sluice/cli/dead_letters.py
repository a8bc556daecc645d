"""``sluice dead-letters list|show|requeue|purge``: messages workers could not run."""

from __future__ import annotations

import datetime

import click
import redis
from rich.table import Table

from sluice.cli.common import app_option, broker_client, console, load_app
from sluice.queues import dead_letters
from sluice.queues.broker.layout import RedisLayout

_app_option = app_option("App whose broker (and transport options) to use (default: the configured one).")
_number_option = click.option(
    "-n",
    "--number",
    type=click.IntRange(min=0),
    default=None,
    help="Only the dead letter with this number (from `list`); default: all of them.",
)


def _broker(app_name: str | None) -> tuple[redis.Redis, RedisLayout]:
    """The broker and the layout of its queues: the app's (its transport options), else the defaults."""
    if app_name:
        app = load_app(app_name)
        return app.redis, RedisLayout.of_app(app)
    return broker_client(None).client, RedisLayout()


@click.group("dead-letters")
def dead_letters_group() -> None:
    """Messages a worker could not run (not decodable, no valid envelope, an unregistered task,
    sluice's own hooks failing), kept per queue with the reason instead of being dropped.

    \b
      sluice dead-letters list                 every queue with dead letters, or one queue's
      sluice dead-letters show QUEUE -n 0      one dead letter in full
      sluice dead-letters requeue QUEUE        put them back on their queue, to run next
      sluice dead-letters purge QUEUE          delete them for good
    """


@dead_letters_group.command("list")
@click.argument("queue", required=False)
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="At most this many.")
@_app_option
def list_(queue: str | None, limit: int, app_name: str | None) -> None:
    """Without QUEUE: dead letters kept and counted per queue. With QUEUE: its newest ones."""
    client, layout = _broker(app_name)
    if queue is None:
        table = Table(title="dead letters")
        for column in ("queue", "kept", "ever"):
            table.add_column(column, justify="left" if column == "queue" else "right")
        for row in dead_letters.summary(client, layout):
            table.add_row(row.queue, str(row.kept), str(row.total))
        console.print(table)
        return
    table = Table(title=f"dead letters of {queue}, newest first")
    for column in ("#", "at", "task id", "reason", "bytes"):
        table.add_column(column, overflow="fold")
    for number, letter in dead_letters.read(client, layout, queue, 0, limit):
        table.add_row(str(number), _when(letter.at), letter.task_id or "-", letter.reason, str(len(letter.raw)))
    console.print(table)


@dead_letters_group.command()
@click.argument("queue")
@click.option(
    "-n", "--number", type=click.IntRange(min=0), default=0, show_default=True, help="Which dead letter (from `list`)."
)
@click.option(
    "--bytes",
    "max_bytes",
    type=click.IntRange(min=0),
    default=4000,
    show_default=True,
    help="Show at most this much of the raw message.",
)
@_app_option
def show(queue: str, number: int, max_bytes: int, app_name: str | None) -> None:
    """One dead letter: why, when, and the raw message as it was on the queue."""
    client, layout = _broker(app_name)
    letters = dead_letters.read(client, layout, queue, number, 1)
    if not letters:
        raise click.ClickException(f"queue {queue!r} has no dead letter number {number} that can be read")
    _, letter = letters[0]
    click.echo(
        f"queue:   {letter.queue}\nat:      {_when(letter.at)}\nreason:  {letter.reason}\n"
        f"task id: {letter.task_id or '-'}\nbytes:   {len(letter.raw)}"
    )
    click.echo(letter.raw[:max_bytes].decode(errors="backslashreplace"))


@dead_letters_group.command()
@click.argument("queue")
@_number_option
@_app_option
def requeue(queue: str, number: int | None, app_name: str | None) -> None:
    """Put dead letters back on QUEUE, to be taken next (after fixing what made them fail)."""
    client, layout = _broker(app_name)
    click.echo(f"requeued {dead_letters.requeue(client, layout, queue, number)} message(s) onto {queue}")


@dead_letters_group.command()
@click.argument("queue")
@_number_option
@click.confirmation_option(prompt="Delete these dead letters for good?")
@_app_option
def purge(queue: str, number: int | None, app_name: str | None) -> None:
    """Delete dead letters of QUEUE for good (the counter in the metrics keeps its total)."""
    client, layout = _broker(app_name)
    click.echo(f"purged {dead_letters.purge(client, layout, queue, number)} dead letter(s) of {queue}")


def _when(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
