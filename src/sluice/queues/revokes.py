"""Revokes that outlive offline workers: every revoked task id is recorded in Redis for as long
as results are kept, and the fetch script flags a message whose task is recorded, so a worker
that was offline, or restarted, when the revoke was sent still never starts it.

Celery's revoke is a broadcast each live worker keeps in memory (Celery #8888): a worker that
missed it runs the task. Here :class:`SluiceControl` (the App's ``control_cls``) records the ids
of every ``revoke`` broadcast before sending it (``AsyncResult.revoke()``, ``celery control
revoke``, ``sluice revoke``), and the worker adds a flagged message's id to Celery's own revoked
set before Celery judges it (``sluice.workers.admission``): Celery then ends it ``REVOKED``,
sends ``task-revoked`` (Flower shows it) and acknowledges it, as for any revoked task.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable
from typing import Any

import redis
from celery.app.control import Control

from sluice import keys

#: How long a revoke is kept when results never expire (``result_expires=None``): a day.
DEFAULT_KEEP = 86_400.0


def record(client: redis.Redis, task_ids: Iterable[str], keep: float) -> int:
    """Record ``task_ids`` as revoked for ``keep`` seconds (and forget those past theirs); returns how many."""
    ids = [str(task_id) for task_id in task_ids]
    now = time.time()
    pipe = client.pipeline()
    pipe.zremrangebyscore(keys.REVOKED, "-inf", now)
    if ids:
        pipe.zadd(keys.REVOKED, dict.fromkeys(ids, now + keep))
    pipe.execute()
    return len(ids)


def revoked(client: redis.Redis, task_ids: Iterable[str]) -> list[bool]:
    """Whether each task id is recorded as revoked (and not past its keeping)."""
    ids = list(task_ids)
    if not ids:
        return []
    now = time.time()
    return [score is not None and score > now for score in client.zmscore(keys.REVOKED, ids)]


def keep_seconds(app: Any) -> float:
    """How long a revoke is kept: as long as the app keeps results."""
    expires = app.conf.result_expires
    if isinstance(expires, datetime.timedelta):
        return expires.total_seconds()
    return float(expires) if expires else DEFAULT_KEEP


class SluiceControl(Control):
    """Celery's remote control, recording every revoked task id in Redis before the broadcast."""

    def broadcast(self, command: str, arguments: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        if command == "revoke" and arguments and arguments.get("task_id"):
            task_ids = arguments["task_id"]
            ids = [task_ids] if isinstance(task_ids, str) else list(task_ids)
            record(self.app.redis, ids, keep_seconds(self.app))
        return super().broadcast(command, arguments, *args, **kwargs)
