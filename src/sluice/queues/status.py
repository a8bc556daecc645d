"""Per-class figures read from Redis: queue depth, workers online, tasks running, slots."""

from __future__ import annotations

import json
from collections import Counter
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


def reserved_by_queue(client: redis.Redis, unacked_key: str = "unacked") -> Counter[str]:
    """Messages delivered to workers and not yet acknowledged (reserved or running), per queue."""
    counts: Counter[str] = Counter()
    for raw in client.hvals(unacked_key):
        counts[json.loads(raw)[2]] += 1
    return counts


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


def class_status(client: redis.Redis, catalog: Catalog) -> list[ClassStatus]:
    """One row per class, smallest first."""
    beats = read_heartbeats(client)
    reserved = reserved_by_queue(client)
    rows = []
    for rc in catalog:
        serving = [b for b in beats if rc.name in b.get("classes", ())]
        rows.append(ClassStatus(
            rc, queue_depth(client, rc.name), reserved[rc.name], sum(len(b.get("running", ())) for b in serving),
            sum(int(b.get("slots", 0)) for b in serving),
            tuple(sorted(b["hostname"] for b in serving if b.get("running"))),
            tuple(sorted(b["hostname"] for b in serving if not b.get("running")))))
    return rows
