"""The task catalog: what every task the cluster's workers registered needs, kept in Redis.

Each worker publishes an entry per task it registered (declared compute, effective compute over
its app's default, retry policy) when it starts and again every few heartbeats, in the
heartbeat's round trip. It is the cluster's source of truth about tasks: a sender routes a
``send_task`` of a task it has not imported by it, a worker forwards a task it does not have
the code of by it, and ``sluice explain`` / ``sluice status`` read it without importing code.
Two workers with different code for one name: the last to publish wins.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import redis

from sluice import entries, keys
from sluice.compute import Compute
from sluice.tasks import limits
from sluice.tasks.retry import RetryPolicy

log = logging.getLogger("sluice.catalog")


@dataclass(frozen=True)
class TaskEntry:
    """One task as a worker registered it."""

    name: str
    declared: Compute | None  #: the task's own ``compute=`` (None: the app default)
    effective: Compute  #: declared axes over the publishing app's default (memory may be "auto")
    retry: RetryPolicy | None
    worker: str  #: the worker that published it last
    at: float  #: when (epoch seconds)
    fallback: int | None = None  #: bytes a memory="auto" task runs with until learned (its app's default)
    limits: str = ""  #: its rate and concurrency limits in words (``sluice.tasks.limits.describe``)
    #: the limits a message carrying none is held to (``sluice.tasks.limits.task_wide_header``)
    wide_limits: tuple[tuple[Any, ...], ...] = ()

    def encode(self) -> str:
        return json.dumps(
            {
                "declared": self.declared.to_dict() if self.declared is not None else None,
                "effective": self.effective.to_dict(),
                "retry": self.retry.to_dict() if self.retry is not None else None,
                "worker": self.worker,
                "at": self.at,
                "fallback": self.fallback,
                "limits": self.limits,
                "wide_limits": self.wide_limits,
            }
        )

    @classmethod
    def decode(cls, name: str, raw: bytes | str) -> TaskEntry:
        data = entries.loads(raw)
        return cls(
            name,
            Compute.from_dict(data["declared"]) if data.get("declared") else None,
            Compute.from_dict(data["effective"]),
            RetryPolicy.from_dict(data["retry"]) if data.get("retry") else None,
            str(data.get("worker") or "?"),
            float(data.get("at") or 0),
            int(data["fallback"]) if data.get("fallback") else None,
            str(data.get("limits") or ""),
            tuple(tuple(limit) for limit in data.get("wide_limits") or ()),
        )


def entries_of(app: Any, worker: str) -> list[TaskEntry]:
    """An app's tasks as catalog entries (Celery's built-in ``celery.*`` tasks left out)."""
    now = time.time()
    return [
        TaskEntry(
            name,
            getattr(task, "compute", None),
            app.inherited_compute(name),
            getattr(task, "retry_policy", None),
            worker,
            now,
            app.fallback_memory,
            limits.describe(task),
            tuple(tuple(limit) for limit in limits.task_wide_header(task)),
        )
        for name, task in sorted(app.tasks.items())
        if not name.startswith("celery.")
    ]


def publish(client: redis.Redis | Any, found: list[TaskEntry]) -> None:
    """Write a worker's entries, stamped now, and the limits the fetch script holds their
    headerless messages to (two HSETs; ``client`` may be a pipeline)."""
    now = time.time()
    if found:
        client.hset(keys.TASK_CATALOG, mapping={entry.name: replace(entry, at=now).encode() for entry in found})
        client.hset(keys.TASK_LIMITS, mapping={entry.name: json.dumps(entry.wide_limits) for entry in found})


def read(client: redis.Redis) -> dict[str, TaskEntry]:
    """Every entry, by task name; one that does not decode is left out (logged and counted)."""
    found = entries.decode_each(
        "task catalog entry",
        client.hgetall(keys.TASK_CATALOG).items(),
        lambda item: TaskEntry.decode(entries.text(item[0]), item[1]),
    )
    return {entry.name: entry for entry in found}


class TaskDirectory:
    """The catalog as a sender sees it: a local copy, so routing costs no round trip.

    The copy is read again when it is older than ``max_age`` seconds, and at once (at most every
    ``miss_interval`` seconds) when asked for a name it does not hold, so a task a new worker
    just registered is found on its first send.
    """

    def __init__(self, client: Callable[[], redis.Redis], max_age: float = 30.0, miss_interval: float = 1.0) -> None:
        self._client = client
        self.max_age = max_age
        self.miss_interval = miss_interval
        self._entries: Mapping[str, TaskEntry] = {}
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def get(self, name: str) -> TaskEntry | None:
        entry = self._entries.get(name)
        age = time.monotonic() - self._read_at
        if age > self.max_age or (entry is None and age > self.miss_interval):
            self._refresh()
            entry = self._entries.get(name)
        return entry

    def _refresh(self) -> None:
        with self._lock:
            try:
                self._entries = read(self._client())
            except redis.RedisError as exc:  # route by what is known; the publish itself will wait out the outage
                log.warning("could not read the task catalog: %s", exc)
            self._read_at = time.monotonic()
