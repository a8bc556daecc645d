"""Per-class figures read from Redis: queue depth, workers online, tasks running, slots."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from sluice.queues.catalog import Catalog, ResourceClass
from sluice.workers.heartbeat import read_heartbeats

#: kombu's Redis transport keeps messages of priority N in a list named queue + SEP + N.
_PRIORITY_SEP = "\x06\x16"
_PRIORITY_STEPS = (3, 6, 9)


def queue_depth(client: redis.Redis, queue: str) -> int:
    """Messages waiting in a Celery queue on Redis (every priority list of it)."""
    pipe = client.pipeline(transaction=False)
    pipe.llen(queue)
    for step in _PRIORITY_STEPS:
        pipe.llen(f"{queue}{_PRIORITY_SEP}{step}")
    return sum(pipe.execute())


@dataclass(frozen=True)
class ClassStatus:
    resource_class: ResourceClass
    queued: int
    workers: int
    running: int
    slots: int


def class_status(client: redis.Redis, catalog: Catalog) -> list[ClassStatus]:
    """One row per class, smallest first."""
    beats = read_heartbeats(client)
    rows = []
    for rc in catalog:
        serving = [b for b in beats if rc.name in b.get("classes", ())]
        rows.append(ClassStatus(rc, queue_depth(client, rc.name), len(serving),
                                sum(len(b.get("running", ())) for b in serving),
                                sum(int(b.get("slots", 0)) for b in serving)))
    return rows
