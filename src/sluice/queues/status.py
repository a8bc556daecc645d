"""Per-class figures read from Redis: queue depth, workers online, tasks running, slots; the
intake queue's depth; and which tasks of the task catalog each class serves."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import redis

from sluice._kombu import RedisLayout
from sluice.errors import NoQueueFits
from sluice.queues.catalog import Catalog, ResourceClass
from sluice.queues.task_catalog import TaskEntry
from sluice.workers.heartbeat import read_heartbeats


@dataclass(frozen=True)
class ClassStatus:
    """One class's load: what waits, what workers hold, who is online and who is busy."""

    resource_class: ResourceClass
    queued: int
    reserved: int
    running: int
    slots: int
    busy: tuple[str, ...]   #: hostnames of workers running something
    idle: tuple[str, ...]   #: hostnames of online workers running nothing

    @property
    def workers(self) -> int:
        return len(self.busy) + len(self.idle)


def class_status(client: redis.Redis, catalog: Catalog, layout: RedisLayout = RedisLayout()) -> list[ClassStatus]:
    """One row per class, smallest first (``layout``: the broker's transport options)."""
    beats = read_heartbeats(client)
    reserved = layout.held_by_queue(client)
    rows = []
    for rc in catalog:
        serving = [b for b in beats if rc.name in b.classes]
        rows.append(ClassStatus(
            rc, layout.queue_depth(client, rc.name), reserved[rc.name], sum(len(b.running) for b in serving),
            sum(b.slots for b in serving),
            tuple(sorted(b.hostname for b in serving if b.running)),
            tuple(sorted(b.hostname for b in serving if not b.running))))
    return rows


@dataclass(frozen=True)
class IntakeStatus:
    """The intake queue: what waits there to be forwarded, and how many workers drain it."""

    queue: str
    queued: int
    workers: int


def intake_status(client: redis.Redis, intake: str, layout: RedisLayout = RedisLayout()) -> IntakeStatus:
    return IntakeStatus(intake, layout.queue_depth(client, intake),
                        sum(intake in beat.queues for beat in read_heartbeats(client)))


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
