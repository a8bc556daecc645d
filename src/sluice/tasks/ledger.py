"""The delivery ledger: which worker took which attempt of a task, so a redelivery is recognised.

Each time a worker is about to run a message it claims the task in Redis with one
``SET ... GET`` (the old claim comes back), made by the result backend's script in the same
round trip as the task's STARTED state (``sluice.queues.broker.result_backend``), or on its own when no
STARTED state is stored. A message is only redelivered when
the worker holding it never acknowledged it; so an old claim for the same attempt means that
attempt started and never finished. If its worker is gone (heartbeat expired, or a new
instance under the same name), the attempt is counted as lost and the retry policy decides.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import cast

import redis

from sluice import entries, keys
from sluice.tasks.heartbeat import read_heartbeat


@dataclass(frozen=True)
class Claim:
    """A worker instance took attempt ``attempt`` of a task at ``at``."""

    attempt: int
    worker: str
    instance: str
    at: float

    @classmethod
    def load(cls, raw: bytes | str | None) -> Claim | None:
        """The claim ``raw`` holds; ValueError or TypeError when it is not one (readers skip it)."""
        if raw is None:
            return None
        fields = entries.loads(raw)
        if not isinstance(fields, dict):
            raise TypeError(f"a delivery claim is a JSON object, not {type(fields).__name__}")
        return cls(**fields)

    def dump(self) -> str:
        return json.dumps({"attempt": self.attempt, "worker": self.worker, "instance": self.instance, "at": self.at})


@dataclass(frozen=True)
class ClaimWrite:
    """The write that makes a claim: ``SET key value EX ttl GET`` (the old claim comes back).
    The result backend makes it in the same round trip as the task's STARTED state."""

    key: str
    value: str
    ttl: int

    @classmethod
    def of(cls, task_id: str, attempt: int, worker: str, instance: str, ttl: int) -> ClaimWrite:
        return cls(keys.delivery(task_id), Claim(attempt, worker, instance, time.time()).dump(), ttl)


def claim(client: redis.Redis, write: ClaimWrite) -> Claim | None:
    """Record that this worker runs the attempt now; return the claim it replaced, if any."""
    old = client.set(write.key, write.value, ex=write.ttl, get=True)
    return Claim.load(cast("bytes | None", old))  # SET ... GET replies with the old value or nil, never a bool


def current(client: redis.Redis, task_id: str) -> Claim | None:
    return Claim.load(client.get(keys.delivery(task_id)))


def put_back(client: redis.Redis, task_id: str, previous: Claim, ttl: int) -> None:
    """Restore a claim this worker overwrote (the delivery was a duplicate of a live attempt)."""
    client.set(keys.delivery(task_id), previous.dump(), ex=ttl)


def holder_running(client: redis.Redis, task_id: str, held: Claim) -> bool:
    """Is the worker instance that made ``held`` alive and (as far as its heartbeat says) running the task?

    A claim newer than the holder's last heartbeat counts as running: the heartbeat lags.
    """
    beat = read_heartbeat(client, held.worker)
    if beat is None or beat.instance != held.instance:
        return False
    return task_id in beat.running or held.at >= beat.ts
