"""A task's attempt history, kept in Redis so the caller can read it after the fact.

Every attempt that ends without a result appends one record; ``attempts(result)`` returns those
plus, once the task has succeeded, the attempt that did.
"""

from __future__ import annotations

import json
from typing import Any

import redis
from celery.result import AsyncResult

from sluice import entries, keys
from sluice.tasks.retry import AttemptRecord

#: How long a history is kept (as long as sluice keeps memory-kill records).
HISTORY_TTL = keys.MEMORY_KILL_TTL


def append(client: redis.Redis, task_id: str, record: AttemptRecord) -> list[AttemptRecord]:
    """Add one ended attempt; returns the whole history so far."""
    key = keys.attempts(task_id)
    pipe = client.pipeline()
    pipe.rpush(key, json.dumps(record.encode()))
    pipe.expire(key, HISTORY_TTL)
    pipe.lrange(key, 0, -1)
    return _records(pipe.execute()[-1])


def read(client: redis.Redis, task_id: str) -> list[AttemptRecord]:
    return _records(client.lrange(keys.attempts(task_id), 0, -1))


def read_many(client: redis.Redis, task_ids: list[str]) -> dict[str, list[AttemptRecord]]:
    """The histories of several tasks in one round trip."""
    pipe = client.pipeline(transaction=False)
    for task_id in task_ids:
        pipe.lrange(keys.attempts(task_id), 0, -1)
    return {task_id: _records(items) for task_id, items in zip(task_ids, pipe.execute())}


def _records(items: list[bytes | str]) -> list[AttemptRecord]:
    """The attempt records of a history (one that does not decode is skipped)."""
    return entries.decode_each("attempt record", items, lambda item: AttemptRecord.decode(entries.loads(item)))


def attempts(result: AsyncResult) -> list[dict[str, Any]]:
    """Every attempt of a task: the ones that failed (attempt, queue, compute, reason, detail,
    worker) and, if it succeeded, the successful one (attempt, queue, compute, reason, worker:
    from the result's extended meta)."""
    history = [record.encode() for record in read(result.app.redis, result.id)]
    if result.state == "SUCCESS":
        # the meta the result holds once ready (as its ``.queue`` and ``.worker`` read it): an
        # rpc:// result is a message, consumed by ``.get()``, not a record the backend reads again
        meta = result._get_task_meta()
        history.append(
            {
                "attempt": len(history) + 1,
                "queue": meta.get("queue"),
                "compute": meta.get("compute"),
                "reason": "succeeded",
                "worker": meta.get("worker"),
            }
        )
    return history
