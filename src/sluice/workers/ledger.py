"""The delivery ledger: which worker took which attempt of a task, so a redelivery is recognised.

Each time a worker is about to run a message it claims the task in Redis with one
``SET ... GET`` (one round trip, the old claim comes back). A message is only redelivered when
the worker holding it never acknowledged it; so an old claim for the same attempt means that
attempt started and never finished. If its worker is gone (heartbeat expired, or a new
instance under the same name), the attempt is counted as lost and the retry policy decides.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import redis

from sluice import keys
from sluice.workers.heartbeat import read_heartbeat


@dataclass(frozen=True)
class Claim:
    """A worker instance took attempt ``attempt`` of a task at ``at``."""

    attempt: int
    worker: str
    instance: str
    at: float

    @classmethod
    def load(cls, raw: bytes | None) -> Claim | None:
        return None if raw is None else cls(**json.loads(raw))

    def dump(self) -> str:
        return json.dumps(asdict(self))


def claim(client: redis.Redis, task_id: str, attempt: int, worker: str, instance: str, ttl: int) -> Claim | None:
    """Record that this worker runs ``attempt`` now; return the claim it replaced, if any."""
    mine = Claim(attempt, worker, instance, time.time())
    return Claim.load(client.set(keys.delivery(task_id), mine.dump(), ex=ttl, get=True))


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
