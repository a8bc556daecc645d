"""Prometheus metrics per resource class and per task (observed memory), read from Redis at scrape time.

Flower's ``/metrics`` has task events but no queue depth; autoscaling and alerting need both.
Served by ``sluice autoscale`` and by ``sluice metrics`` (compose / local use).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis
from prometheus_client import start_http_server
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
)
from prometheus_client.registry import Collector

from sluice import entries, keys
from sluice.compute import Compute
from sluice.config import Settings
from sluice.deploy.task_events import TaskEventMetrics
from sluice.queues import task_catalog
from sluice.queues.catalog import Catalog
from sluice.queues.status import (
    class_status,
    intake_status,
    limits_running,
    parked_by_limit,
    rate_limits,
    task_route,
    tenant_status,
)
from sluice.tasks import memory_profile


class ClassMetrics(Collector):
    """``sluice_queued``, ``sluice_reserved``, ``sluice_running``, ``sluice_workers_online``,
    ``sluice_slots``, ``sluice_escalations_total``, ``sluice_memory_kills_total`` and
    ``sluice_dead_letters_total``, by class; ``sluice_intake_queued`` (the intake queue's depth),
    ``sluice_forwarded_total`` by ``from`` and ``to`` queue (admission's forwards), and
    ``sluice_unreadable_entries_total`` by ``kind``: entries of Redis structures this process
    skipped because they do not decode (``sluice.entries``)."""

    def __init__(self, client: redis.Redis, catalog: Catalog, intake: str = Settings.intake_queue) -> None:
        self.client = client
        self.catalog = catalog
        self.intake = intake

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gauges = {
            name: GaugeMetricFamily(f"sluice_{name}", help_text, labels=["resource_class"])
            for name, help_text in (
                ("queued", "Messages waiting in the class's queue"),
                ("reserved", "Messages held by workers, not yet acknowledged"),
                ("running", "Tasks running on the class's workers"),
                ("workers_online", "Workers serving the class with a live heartbeat"),
                ("slots", "Task slots of the class's online workers"),
            )
        }
        counters = {
            name: CounterMetricFamily(f"sluice_{name}", help_text, labels=["resource_class"])
            for name, help_text in (
                ("escalations", "Attempts re-published at a bigger size after dying on this class"),
                ("memory_kills", "Tasks the watchdog killed for memory on this class"),
                ("dead_letters", "Messages from the class's queue kept as dead letters instead of run"),
            )
        }
        rows = class_status(self.client, self.catalog)
        totals = self.client.mget([keys.stat(n, r.resource_class.name) for r in rows for n in counters])
        for index, row in enumerate(rows):
            name = row.resource_class.name
            for gauge, value in (
                ("queued", row.queued),
                ("reserved", row.reserved),
                ("running", row.running),
                ("workers_online", row.workers),
                ("slots", row.slots),
            ):
                gauges[gauge].add_metric([name], value)
            for offset, counter in enumerate(counters.values()):
                counter.add_metric(
                    [name],
                    entries.decode_one("counter", totals[index * len(counters) + offset], lambda raw: int(raw or 0), 0),
                )
        yield from gauges.values()
        yield from counters.values()
        intake = GaugeMetricFamily(
            "sluice_intake_queued", "Messages waiting in the intake queue to be forwarded", labels=["queue"]
        )
        intake.add_metric([self.intake], intake_status(self.client, self.intake).queued)
        forwarded = CounterMetricFamily(
            "sluice_forwarded",
            "Messages workers forwarded to the class that holds them (from the intake, or from a class too small)",
            labels=["from", "to"],
        )
        forwards = entries.decode_each("forward count", self.client.hgetall(keys.FORWARDED).items(), _forwards)
        for source, target, count in sorted(forwards):
            forwarded.add_metric([source, target], count)
        yield intake
        yield forwarded
        unreadable = CounterMetricFamily(
            "sluice_unreadable_entries",
            "Entries of sluice's Redis structures this process skipped because they do not decode",
            labels=["kind"],
        )
        for kind, count in sorted(entries.skipped.items()):
            unreadable.add_metric([kind], count)
        yield unreadable


def _forwards(item: tuple[bytes | str, bytes | str]) -> tuple[str, str, int]:
    """One field of the forward counts: ``"<from> <to>"`` -> how many."""
    source, _, target = entries.text(item[0]).partition(" ")
    return source, target, int(item[1])


class TaskMetrics(Collector):
    """Observed memory per task (``sluice.tasks.memory_profile``): ``sluice_task_memory_bytes``
    by ``task`` and ``quantile`` (p50, p95, peak), ``sluice_task_runs_observed_total`` and
    ``sluice_task_memory_kills_total``, by task; and ``sluice_task_slot_memory_bytes`` by task and
    ``resource_class``: the slot of the class the task routes to now (what its memory is measured
    against: the alert on a task outgrowing half its slot)."""

    def __init__(self, client: redis.Redis, catalog: Catalog, settings: Settings) -> None:
        self.client, self.catalog, self.settings = client, catalog, settings

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        sizes = GaugeMetricFamily(
            "sluice_task_memory_bytes", "Observed peak memory of a task's runs", labels=["task", "quantile"]
        )
        runs = CounterMetricFamily("sluice_task_runs_observed", "Runs whose peak memory was observed", labels=["task"])
        kills = CounterMetricFamily("sluice_task_memory_kills", "Runs killed for memory", labels=["task"])
        slots = GaugeMetricFamily(
            "sluice_task_slot_memory_bytes",
            "Memory of one slot of the class the task routes to",
            labels=["task", "resource_class"],
        )
        catalogued = task_catalog.read(self.client)
        for task in memory_profile.observed_tasks(self.client):
            found = memory_profile.read(self.client, task)
            for quantile, value in (("p50", found.p50), ("p95", found.p95), ("peak", found.peak)):
                sizes.add_metric([task, quantile], value)
            runs.add_metric([task], found.count)
            kills.add_metric([task], found.kills)
            entry = catalogued.get(task)
            routed = task_route(entry, found, self.catalog, self.settings)[1] if entry is not None else None
            if routed is not None and routed.slot.memory_bytes:
                slots.add_metric([task, routed.name], routed.slot.memory_bytes)
        yield from (sizes, runs, kills, slots)


class TenantMetrics(Collector):
    """Per class and tenant (``sluice.tenants``): ``sluice_tenant_running`` (what its running
    tasks hold) and ``sluice_tenant_quota`` by ``resource`` (``cpu`` in cores, ``memory`` in
    bytes, ``gpu``; a quota only where one is set), ``sluice_tenant_waiting`` and
    ``sluice_tenant_weight``."""

    def __init__(self, client: redis.Redis, catalog: Catalog) -> None:
        self.client, self.catalog = client, catalog

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["resource_class", "tenant"]
        running = GaugeMetricFamily(
            "sluice_tenant_running", "What the tenant's running tasks hold on the class", labels=[*labels, "resource"]
        )
        quota = GaugeMetricFamily(
            "sluice_tenant_quota", "The most the tenant's tasks may hold on the class", labels=[*labels, "resource"]
        )
        waiting = GaugeMetricFamily("sluice_tenant_waiting", "Its messages waiting on the class", labels=labels)
        weight = GaugeMetricFamily("sluice_tenant_weight", "The tenant's weight on the class", labels=labels)
        for row in tenant_status(self.client, self.catalog):
            where = [row.queue, row.tenant]
            for resource, value in _resources(row.running):
                running.add_metric([*where, resource], value or 0)
            if row.share.quota is not None:
                for resource, value in _resources(row.share.quota):
                    if value is not None:
                        quota.add_metric([*where, resource], value)
            waiting.add_metric(where, row.waiting)
            weight.add_metric(where, row.share.weight)
        yield from (running, quota, waiting, weight)


class LimitMetrics(Collector):
    """``sluice_limit_running{limit}``: the tasks running now under each concurrency limit (a limit
    with none running is not listed); ``sluice_limit_rate{limit}``, the starts per second of each
    rate limit used in the last ten minutes, ``sluice_limit_next_start_seconds{limit}``, how
    long until its next call may start (0: one may now), and ``sluice_limit_waiting{limit}``,
    the calls parked waiting for it. See ``sluice.tasks.limits``."""

    def __init__(self, client: redis.Redis, catalog: Catalog) -> None:
        self.client, self.catalog = client, catalog

    def collect(self) -> Iterator[GaugeMetricFamily]:
        running = GaugeMetricFamily("sluice_limit_running", "Tasks running under a concurrency limit", labels=["limit"])
        for limit, count in limits_running(self.client).items():
            running.add_metric([limit], count)
        rate = GaugeMetricFamily("sluice_limit_rate", "Starts per second a rate limit allows", labels=["limit"])
        next_start = GaugeMetricFamily(
            "sluice_limit_next_start_seconds", "Seconds until a rate limit lets its next call start", labels=["limit"]
        )
        waiting = GaugeMetricFamily(
            "sluice_limit_waiting", "Calls waiting for a rate limit's next start", labels=["limit"]
        )
        for use in rate_limits(self.client):
            rate.add_metric([use.limit], use.per_second)
            next_start.add_metric([use.limit], use.next_in)
        for limit, count in parked_by_limit(self.client, self.catalog).items():
            waiting.add_metric([limit], count)
        yield from (running, rate, next_start, waiting)


def _resources(compute: Compute) -> tuple[tuple[str, float | None], ...]:
    """A compute's axes in Prometheus's base units (cores, bytes, count); None where unset."""
    cores = None if compute.millicores is None else compute.millicores / 1000
    return ("cpu", cores), ("memory", compute.memory_bytes), ("gpu", compute.gpu)


def serve(
    client: redis.Redis,
    catalog: Catalog,
    port: int,
    address: str = "0.0.0.0",
    intake: str = Settings.intake_queue,
    events_app: Any = None,
    task_names: int = Settings.metrics_task_names,
    settings: Settings | None = None,
) -> CollectorRegistry:
    """Serve :func:`registry`'s metrics on ``port`` from a background thread; returns the registry."""
    served = registry(client, catalog, intake, events_app, task_names, settings)
    start_http_server(port, addr=address, registry=served)
    return served


def registry(
    client: redis.Redis,
    catalog: Catalog,
    intake: str = Settings.intake_queue,
    events_app: Any = None,
    task_names: int = Settings.metrics_task_names,
    settings: Settings | None = None,
) -> CollectorRegistry:
    """Every metric ``sluice metrics`` serves. With ``events_app``, also the task metrics counted
    from its broker's Celery events, on a thread started here (at most ``task_names`` names;
    ``sluice.deploy.task_events``). ``settings``: how learned memory routes a task (default:
    the configured)."""
    found = CollectorRegistry()
    found.register(ClassMetrics(client, catalog, intake))
    found.register(TaskMetrics(client, catalog, settings or Settings.load()))
    found.register(TenantMetrics(client, catalog))
    found.register(LimitMetrics(client, catalog))
    if events_app is not None:
        TaskEventMetrics(events_app, found, catalog, task_names).start()
    return found
