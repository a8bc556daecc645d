"""Per-class figures read from Redis: queue depth, workers online, tasks running, slots; per
class and tenant, what waits and what runs against the tenant's share; the intake queue's
depth; which tasks of the task catalog each class serves; and the compute that a packed class's
waiting and held messages need."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import redis

from sluice import entries, keys
from sluice.compute import Compute
from sluice.config import Settings, fallback_memory
from sluice.errors import NoQueueFits
from sluice.headers import Headers
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.catalog import Catalog, ResourceClass
from sluice.queues.task_catalog import TaskEntry
from sluice.tasks import memory_profile
from sluice.tasks.heartbeat import read_heartbeats
from sluice.tenants import DEFAULT_TENANT, Share, split_queue


@dataclass(frozen=True)
class ClassStatus:
    """One class's load: what waits, what workers hold, who is online and who is busy."""

    resource_class: ResourceClass
    queued: int
    reserved: int
    running: int
    slots: int
    busy: tuple[str, ...]  #: hostnames of workers running something
    idle: tuple[str, ...]  #: hostnames of online workers running nothing
    #: Of ``queued``, what the tenants' quotas let start now (see :func:`runnable`); the same
    #: when no quota is set.
    runnable: int | None = None

    @property
    def demand(self) -> int:
        """What waits and may start: ``runnable`` (``queued`` when not counted)."""
        return self.queued if self.runnable is None else self.runnable

    @property
    def workers(self) -> int:
        return len(self.busy) + len(self.idle)


def class_status(client: redis.Redis, catalog: Catalog, layout: RedisLayout = RedisLayout()) -> list[ClassStatus]:
    """One row per class, smallest first (``layout``: the broker's transport options)."""
    beats = read_heartbeats(client)
    reserved = layout.held_by_queue(client)
    usage = layout.tenant_usage_of(client) if any(rc.tenants for rc in catalog) else {}
    rows = []
    for rc in catalog:
        serving = [b for b in beats if rc.name in b.classes]
        depths = layout.tenant_depths(client, rc.name)
        rows.append(
            ClassStatus(
                rc,
                sum(depths.values()),
                reserved[rc.name],
                sum(len(b.running) for b in serving),
                sum(b.slots for b in serving),
                tuple(sorted(b.hostname for b in serving if b.running)),
                tuple(sorted(b.hostname for b in serving if not b.running)),
                runnable(rc, depths, usage),
            )
        )
    return rows


def runnable(rc: ResourceClass, depths: Mapping[str, int], usage: Mapping[tuple[str, str], Compute]) -> int:
    """How many of the messages waiting for ``rc`` (``depths``: per tenant) their tenants' quotas
    let start now, counting each as one slot: a tenant at its quota adds none, however many wait."""
    total = 0
    for tenant, waiting in depths.items():
        quota = rc.share(tenant).quota
        if quota is None:
            total += waiting
            continue
        used = usage.get((rc.name, tenant), Compute())
        room = waiting
        for cap, have, size in (
            (quota.millicores, used.millicores, rc.slot.millicores),
            (quota.memory_bytes, used.memory_bytes, rc.slot.memory_bytes),
            (quota.gpu, used.gpu, rc.slot.gpu),
        ):
            if cap is not None and size:
                room = min(room, max(0, (cap - (have or 0)) // size))
        total += room
    return total


@dataclass(frozen=True)
class TenantStatus:
    """One tenant on one class: what it is given, what it waits with, what its running tasks hold."""

    queue: str
    tenant: str
    share: Share
    waiting: int
    running: Compute  #: the sum of its held messages' charges (an axis with none unset)


def tenant_status(client: redis.Redis, catalog: Catalog, layout: RedisLayout = RedisLayout()) -> list[TenantStatus]:
    """One row per class and tenant that has a share configured, messages waiting or tasks
    running there, by class (smallest first) then tenant; none for a class that only the
    default tenant uses, with no share configured (it is not shared)."""
    usage = layout.tenant_usage_of(client)
    rows = []
    for rc in catalog:
        depths = layout.tenant_depths(client, rc.name)
        named = {name for name, _ in rc.tenants} | {t for (q, t) in usage if q == rc.name}
        named |= {t for t, n in depths.items() if n}
        if named <= {DEFAULT_TENANT} and not rc.tenants:
            continue
        for tenant in sorted(named):
            running = usage.get((rc.name, tenant), Compute())
            rows.append(TenantStatus(rc.name, tenant, rc.share(tenant), depths.get(tenant, 0), running))
    return rows


def task_route(
    entry: TaskEntry, observed: memory_profile.MemoryProfile | None, catalog: Catalog, settings: Settings
) -> tuple[Compute, ResourceClass | None]:
    """The compute a catalogued task runs with now (``memory="auto"`` learned from ``observed``)
    and the class that holds it (None: none does)."""
    effective = memory_profile.with_learned_memory(
        entry.effective,
        observed or memory_profile.EMPTY,
        settings,
        entry.fallback or fallback_memory(Compute(), settings),
    )
    try:
        return effective, catalog.route(effective, entry.name)
    except NoQueueFits:
        return effective, None


def limits_running(client: redis.Redis) -> dict[str, int]:
    """Each concurrency limit's running count now (``sluice.tasks.limits``; none running: not listed)."""
    counts = entries.decode_each("limit count", client.hgetall(keys.LIMIT_RUNNING).items(), _count)
    return dict(sorted(counts))


@dataclass(frozen=True)
class RateUse:
    """A rate limit a call started under in the last ten minutes (``sluice.tasks.limits``)."""

    limit: str
    per_second: float
    last_start: float  #: when the last call under it started (epoch seconds, Redis's clock)
    next_in: float  #: seconds until the next may start (0: one may start now)


def rate_limits(client: redis.Redis) -> list[RateUse]:
    """Each rate limit used in the last ten minutes, by id (two round trips)."""
    used = cast("list[tuple[bytes, float]]", client.zrange(keys.LIMIT_RATES, 0, -1, withscores=True))
    listed = entries.decode_each("rate limit", used, _rate_entry)
    if not listed:
        return []
    pipe = client.pipeline(transaction=False)
    for limit, _, _ in listed:
        pipe.get(keys.LIMIT_NEXT_PREFIX + limit)
    pipe.time()
    *nexts, (seconds, micros) = pipe.execute()
    now = seconds * 1_000_000 + micros
    uses = [
        RateUse(limit, 1 / every, last, max(0.0, (int(nxt) - now) / 1e6) if nxt else 0.0)
        for (limit, every, last), nxt in zip(listed, nexts)
    ]
    return sorted(uses, key=lambda use: use.limit)


def parked_by_limit(client: redis.Redis, catalog: Catalog, layout: RedisLayout = RedisLayout()) -> dict[str, int]:
    """Messages waiting for each rate limit's next start (parked, every class, every tenant)."""
    lists = [key for rc in catalog for found in layout.parked_lists(client, rc.name).values() for key in found]
    if not lists:
        return {}
    pipe = client.pipeline(transaction=False)
    for key in lists:
        pipe.llen(key)
    counts: dict[str, int] = {}
    for key, count in zip(lists, pipe.execute()):
        limit = key.split("\t", 3)[-1]  # <index>\t<tenant>\t<line>\t<id>: an id may hold tabs
        counts[limit] = counts.get(limit, 0) + int(count)
    return counts


def _rate_entry(item: tuple[bytes | str, float]) -> tuple[str, float, float]:
    limit, every = entries.text(item[0]).rsplit("\t", 1)
    return limit, float(every), float(item[1])


def _count(item: tuple[bytes | str, bytes | str]) -> tuple[str, int]:
    return entries.text(item[0]), int(item[1])


@dataclass(frozen=True)
class IntakeStatus:
    """The intake queue: what waits there to be forwarded, and how many workers drain it."""

    queue: str
    queued: int
    workers: int


def intake_status(client: redis.Redis, intake: str, layout: RedisLayout = RedisLayout()) -> IntakeStatus:
    return IntakeStatus(
        intake, layout.queue_depth(client, intake), sum(intake in beat.queues for beat in read_heartbeats(client))
    )


def tasks_by_class(entries: Mapping[str, TaskEntry], catalog: Catalog) -> dict[str, list[str]]:
    """The task catalog's names grouped by the class each routes to (one no class holds: ``?``)."""
    grouped: dict[str, list[str]] = {}
    for name, entry in sorted(entries.items()):
        try:
            where = catalog.route(entry.effective, name).name
        except NoQueueFits:
            where = "?"
        grouped.setdefault(where, []).append(name)
    return grouped


def message_compute(app: Any, message: Mapping[str, Any]) -> Compute:
    """The effective compute of a waiting or held message: its ``sluice_compute`` header, else
    the task's (the app's code, else the task catalog), else the app's default."""
    headers = message.get("headers") or {}
    name = str(headers.get("task") or "")
    try:
        compute = Headers.read(headers).compute
    except (ValueError, TypeError, KeyError, AttributeError):  # a bad header: admission dead-letters it
        compute = None
    if compute is not None:
        return app.resolve(name, compute.inherit(app.default_compute))
    if name in app.tasks:
        return app.effective_compute(name)
    entry = app.task_directory.get(name)
    if entry is None:
        return app.unlearned(app.default_compute)
    return app.resolve(name, entry.effective, entry.fallback)


def demand(
    app: Any, client: redis.Redis, queue: str, layout: RedisLayout = RedisLayout(), sample: int = 1000
) -> tuple[int, int]:
    """Millicores and bytes that the messages waiting in ``queue`` and held from it need (for a
    packed class's autoscaling). Past ``sample`` waiting messages, their mean stands for the rest."""
    waiting = layout.waiting(client, queue, sample)
    depth = layout.queue_depth(client, queue)
    held = [item.message for item in layout.held(client) if split_queue(item.queue)[0] == queue]
    computes = [message_compute(app, m) for m in waiting]
    scale = depth / len(computes) if computes and depth > len(computes) else 1.0
    millicores = sum(c.millicores or 0 for c in computes) * scale
    memory = sum(c.memory_bytes or 0 for c in computes) * scale
    for message in held:
        compute = message_compute(app, message)
        millicores, memory = millicores + (compute.millicores or 0), memory + (compute.memory_bytes or 0)
    return int(millicores), int(memory)
