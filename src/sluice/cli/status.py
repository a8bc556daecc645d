"""``sluice status`` and ``sluice explain``: what the cluster holds per class, and where each task
routes and why."""

from __future__ import annotations

import time

import click
import redis
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table

from sluice.cli.common import Broker, app_option, broker_client, console, format_age, load_app, reader
from sluice.compute import Compute
from sluice.queues import task_catalog
from sluice.queues.status import (
    TenantStatus,
    class_status,
    intake_status,
    limits_running,
    parked_by_limit,
    rate_limits,
    task_route,
    tasks_by_class,
    tenant_status,
)
from sluice.tasks import memory_profile
from sluice.units import format_size


@click.command()
@app_option("App whose catalog to use (default: the configured one).")
@click.option("--watch", is_flag=True, help="A live view, read again every --interval seconds; Ctrl-C ends it.")
@click.option(
    "--interval", type=click.FloatRange(0.2, 3600), default=2.0, show_default=True, help="Seconds between reads."
)
def status(app_name: str | None, watch: bool, interval: float) -> None:
    """Per resource class: queue depth (every tenant's), workers online, tasks running, slot
    size, and the tasks of the cluster's task catalog it serves; then the intake queue (plain
    Celery clients' tasks waiting to be forwarded); then, where a class is shared, each tenant's
    weight and quota there, its waiting messages and what its running tasks hold; then how many
    run under each concurrency limit, and each rate limit used in the last ten minutes with when
    its next call may start. With --watch, a live view for those without Grafana."""
    broker = broker_client(app_name)
    if not watch:
        console.print(_view(broker))
        return
    with Live(_view(broker, time.strftime("%H:%M:%S")), console=console, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(_view(broker, time.strftime("%H:%M:%S")), refresh=True)
        except KeyboardInterrupt:
            pass


def _view(broker: Broker, at: str | None = None) -> Group:
    """What ``sluice status`` shows, read now (``at``: the time to put in the title, for --watch)."""
    try:
        rows = class_status(broker.client, broker.catalog)
        intake = intake_status(broker.client, broker.settings.intake_queue)
        serves = tasks_by_class(task_catalog.read(broker.client), broker.catalog)
        tenants = tenant_status(broker.client, broker.catalog)
        limited = limits_running(broker.client)
        rates = rate_limits(broker.client)
        parked = parked_by_limit(broker.client, broker.catalog)
    except redis.RedisError as exc:
        raise click.ClickException(f"cannot read the broker: {exc}") from None
    table = Table(title=f"sluice status at {at}" if at else "sluice status")
    for column in ("class", "queued", "workers", "running", "slots", "slot size", "tasks"):
        table.add_column(column, justify="left" if column in ("class", "slot size", "tasks") else "right")
    for row in rows:
        name = row.resource_class.name
        table.add_row(
            name,
            str(row.queued),
            str(row.workers),
            str(row.running),
            str(row.slots),
            row.resource_class.slot.describe(),
            ", ".join(serves.get(name, [])) or "-",
        )
    table.add_row(
        f"{intake.queue} (intake)",
        str(intake.queued),
        str(intake.workers),
        "-",
        "-",
        "-",
        "forwarded to the class that fits",
    )
    parts: list[RenderableType] = [table]
    if tenants:
        parts.append(_tenant_table(tenants))
    if limited:
        parts.append("running under concurrency limits: " + ", ".join(f"{k} {n}" for k, n in limited.items()))
    if rates:
        parts.append(
            "rate limits (used in the last 10 min): "
            + ", ".join(
                f"{r.limit} {r.per_second:g}/s, next start in {r.next_in:.2f} s, {parked.get(r.limit, 0)} waiting"
                for r in rates
            )
        )
    if serves.get("?"):
        parts.append(f"[yellow]no class here holds[/yellow] {', '.join(serves['?'])}")
    return Group(*parts)


def _tenant_table(rows: list[TenantStatus]) -> Table:
    """The tenants table of ``sluice status``."""
    table = Table(title="tenants (fair share at fetch: the lowest weighted dominant share goes next)")
    for column in ("class", "tenant", "weight", "quota", "waiting", "running holds"):
        table.add_column(column, justify="right" if column in ("weight", "waiting") else "left")
    for row in rows:
        quota = row.share.quota.describe() if row.share.quota is not None else "-"
        running = row.running
        holding = running.describe() if any((running.millicores, running.memory_bytes, running.gpu)) else "-"
        table.add_row(row.queue, row.tenant, f"{row.share.weight:g}", quota, str(row.waiting), holding)
    return table


@click.command()
@app_option(
    "Module (or module:attr) holding the sluice App. Without it, the tasks come from the cluster's "
    "task catalog (what running workers registered) and the classes from the settings."
)
@click.option(
    "--from-cluster",
    is_flag=True,
    help="With -A: read the tasks from the cluster's task catalog instead of the app's code "
    "(the app's classes still route them).",
)
def explain(app_name: str | None, from_cluster: bool) -> None:
    """For each task: declared compute, effective compute, retry policy, rate and concurrency
    limits, the class it routes to, and the memory its runs were observed to use (p50/p95/peak,
    runs), flagged when the declared memory is over twice the p95 (over-provisioned) or runs
    were killed for memory."""
    from_code = bool(app_name) and not from_cluster
    if from_code:
        app = load_app(str(app_name))
        broker = Broker(reader(app.conf.broker_url, timeout=2), app.catalog, app.settings)
        entries = task_catalog.entries_of(app, "this code")
    else:
        broker = broker_client(app_name)
        try:
            entries = list(task_catalog.read(broker.client).values())
        except redis.RedisError as exc:
            raise click.ClickException(f"cannot read the broker: {exc}") from None
        if not entries:
            raise click.ClickException(
                "the task catalog is empty: no sluice worker has started against this "
                "broker yet (give -A to read an app's code instead)"
            )
    table = Table(title=f"routing for {app_name}" if from_code else "routing of the cluster's task catalog")
    for column in (
        "task",
        "declared",
        "effective",
        "retry",
        "limits",
        "class",
        "observed p50/p95/peak (runs)",
        "flag",
        *(() if from_code else ("published by",)),
    ):
        table.add_column(column)
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            observed = memory_profile.read(broker.client, entry.name)
        except redis.RedisError:
            observed = None
        effective, routed = task_route(entry, observed, broker.catalog, broker.settings)
        where = routed.name if routed is not None else "[red]no class fits[/red]"
        cells = [
            entry.name,
            entry.declared.describe() if entry.declared else "(default)",
            effective.describe(),
            entry.retry.describe() if entry.retry is not None else "-",
            entry.limits or "-",
            where,
            *_observed(observed, effective),
        ]
        if not from_code:
            cells.append(f"{entry.worker}, {format_age(max(time.time() - entry.at, 0))} ago")
        table.add_row(*cells)
    console.print(table)
    console.print("classes, smallest first: " + "; ".join(rc.describe() for rc in broker.catalog))


def _observed(profile: memory_profile.MemoryProfile | None, effective: Compute) -> tuple[str, str]:
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
