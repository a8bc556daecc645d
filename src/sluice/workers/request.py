"""ComputeRequest: Celery's worker-side Request, taught to name a memory kill for what it is."""

from __future__ import annotations

import json
from typing import Any

from billiard.einfo import ExceptionInfo, ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery.worker.request import Request

from sluice import keys
from sluice.errors import MemoryKilled


class ComputeRequest(Request):
    """When a pool process dies and the watchdog recorded a memory kill for this task,
    the task fails with :class:`MemoryKilled` (its message names size and class) instead of
    Celery's bare ``WorkerLostError``."""

    def on_failure(self, exc_info: ExceptionInfo, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if isinstance(exc, WorkerLostError):
            record = self.task.app.redis.get(keys.memory_kill(self.id))
            if record is not None:
                exc_info = _memory_killed_info(json.loads(record)["message"], exc)
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)


def _memory_killed_info(message: str, cause: BaseException) -> ExceptionInfo:
    try:
        raise MemoryKilled(message) from cause
    except MemoryKilled:
        return ExceptionInfo()
