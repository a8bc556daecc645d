"""``sluice runs`` (list the batch runs and what they take in Redis and on disk) and
``sluice runs forget ID`` (delete one now)."""

from __future__ import annotations

import time
from pathlib import Path

import click
import redis
from rich.table import Table

from sluice import entries, keys
from sluice.cli.common import configured_broker_url, console, format_age, reader
from sluice.client.batch import runs
from sluice.config import Settings
from sluice.units import format_size


def _broker(settings: Settings) -> redis.Redis | None:
    """The configured broker (or a running `sluice up`'s), if there is one and it answers."""
    url = configured_broker_url(settings)
    if not url:
        return None
    client = reader(url)
    try:
        client.ping()
    except redis.RedisError:
        console.print(
            f"[yellow]the broker {runs.describe_broker(url)} does not answer: its runs are not listed[/yellow]"
        )
        return None
    return client


def _on_broker(client: redis.Redis) -> set[str]:
    """Ids of the runs whose task file is on the broker (every run publishes it first)."""
    head, tail = keys.run("\0", keys.RunPart.SOURCE).split("\0")
    return set(
        entries.decode_each(
            "run key name",
            client.scan_iter(match=keys.run("*", keys.RunPart.SOURCE)),
            lambda key: key.decode()[len(head) : -len(tail)],
        )
    )


@click.group("runs", invoke_without_command=True)
@click.pass_context
def runs_group(ctx: click.Context) -> None:
    """The runs of `sluice compute`: each with its state, what it takes in Redis and on disk,
    and when that expires (run_ttl after the run ends, default 3 days; `--keep` keeps the run's
    directory). Listing also deletes what has expired."""
    if ctx.invoked_subcommand is not None:
        return
    settings = Settings.load()
    for run_id in runs.sweep(settings.home, settings.run_ttl):
        console.print(f"expired: run {run_id} (its directory was deleted)")
    client = _broker(settings)
    local = {record.run_id: record for record in runs.records(settings.home)}
    remote = _on_broker(client) if client is not None else set()
    table = Table(title="sluice runs")
    for column in ("run", "started", "state", "broker", "redis", "disk", "expires", "sink"):
        table.add_column(column, justify="right" if column in ("redis", "disk") else "left")
    now = time.time()
    for run_id, record in local.items():
        if record.broker == "embedded":
            in_redis = f"{format_size(runs.disk_bytes(runs.redis_dir(settings.home, run_id)))} (its own, on disk)"
        else:
            in_redis = format_size(runs.redis_bytes(client, run_id)) if client is not None and run_id in remote else "-"
        disk = runs.disk_bytes(runs.run_dir(settings.home, run_id))
        if not record.default_sink:
            disk += runs.disk_bytes(Path(record.sink))
        expires = record.expires_at(settings.run_ttl)
        expiry = "kept" if record.keep else "-" if expires is None else f"in {format_age(expires - now)}"
        table.add_row(
            run_id,
            f"{format_age(now - record.started)} ago",
            _state(record),
            record.broker,
            in_redis,
            format_size(disk),
            expiry,
            record.sink,
        )
    if client is not None:
        for run_id in sorted(remote - set(local)):
            table.add_row(
                run_id,
                "?",
                "on the broker (started elsewhere)",
                "broker",
                format_size(runs.redis_bytes(client, run_id)),
                "-",
                "by its TTL",
                "?",
            )
    console.print(table)


def _state(record: runs.RunRecord) -> str:
    if record.running:
        return f"running (pid {record.pid})"
    if record.ended is None:
        return "died (never ended)"
    return {0: "ok", 1: "some failed", 130: "interrupted", 75: "lost its broker"}.get(
        record.exit_code or 0, "ended"
    ) + f" (exit {record.exit_code})"


@runs_group.command("forget")
@click.argument("run_id")
def forget(run_id: str) -> None:
    """Delete run RUN_ID now: its keys in Redis and its directory (with a default sink). A sink
    given with --sink is yours and stays."""
    settings = Settings.load()
    record = runs.RunRecord.read(settings.home, run_id)
    if record is not None and record.running:
        raise click.ClickException(f"run {run_id} is running (pid {record.pid}): stop it first (Ctrl-C)")
    client = _broker(settings) if record is None or record.broker != "embedded" else None
    if record is None and (client is None or run_id not in _on_broker(client)):
        raise click.ClickException(f"no run {run_id!r} here or on the broker; `sluice runs` lists them")
    if record is None:
        client.delete(*runs.run_keys(run_id))  # type: ignore[union-attr]
        console.print(f"forgot run {run_id}: its keys on the broker")
        return
    runs.forget(settings.home, record, client)
    kept = "" if record.default_sink else f"; your sink {record.sink} stays"
    console.print(f"forgot run {run_id}: its Redis data and {runs.run_dir(settings.home, run_id)}{kept}")
