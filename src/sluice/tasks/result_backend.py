"""Celery's Redis result backend, and one more field in what it stores: the compute a task's
successful attempt ran with, so ``sluice.attempts()`` can say at which size a task succeeded
(the failed attempts' records carry theirs). It rides in the result meta Celery writes anyway
(``result_extended``), so it costs no round trip. A task declared ``result_args=False`` keeps
its arguments out of that meta (a batch chunk's are up to a thousand items, already in Redis).
And a sender subscribes to a task's result channel when it waits for the result, not when it
sends the task. Installed by the App as the backend for ``redis://``, ``rediss://`` and ``sentinel://`` URLs
(the loader's ``override_backends``)."""

from __future__ import annotations

from typing import Any

from celery import states
from celery.backends.redis import RedisBackend, SentinelBackend

#: What the App maps result backend URLs to, by scheme.
PATHS = {scheme: f"{__name__}:ComputeResultBackend" for scheme in ("redis", "rediss")} | {
    "sentinel": f"{__name__}:ComputeSentinelBackend"}


class WithCompute:
    """Mixed into Celery's Redis backends: a ComputeTask's successful result names its compute,
    and the state of one with ``result_args=False`` leaves out its arguments."""

    def _get_result_meta(self, result: Any, state: str, traceback: Any, request: Any, format_date: bool = True,
                         encode: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = super()._get_result_meta(  # type: ignore[misc]
            result, state, traceback, request, format_date=format_date, encode=encode)
        if request is None:
            return meta
        from sluice.tasks.base import ComputeTask
        from sluice.tasks.escalation import Attempt

        task = self.app.tasks.get(getattr(request, "task", None) or "")  # type: ignore[attr-defined]
        if not isinstance(task, ComputeTask):
            return meta
        if not task.result_args:
            meta.pop("args", None)
            meta.pop("kwargs", None)
        if state == states.SUCCESS:
            meta["compute"] = Attempt.of(task, request, getattr(request, "delivery_info", None)).compute.to_dict()
        return meta


class SubscribeOnWait:
    """Mixed into Celery's Redis backends: ``.delay()`` does not subscribe to the task's result
    channel (Celery's ``on_task_call``); ``.get()``, ``.then()`` and joins subscribe when they
    start waiting, then read the stored result, so a result that came first is not missed. Most
    results sent are never waited on, and each subscription was two more commands (SUBSCRIBE
    at the send, UNSUBSCRIBE when the result object is collected) in every ``.delay()``."""

    def on_task_call(self, producer: Any, task_id: str) -> None:
        return None


class ComputeResultBackend(WithCompute, SubscribeOnWait, RedisBackend):
    """Celery's Redis result backend, with the compute of the attempt that succeeded."""


class ComputeSentinelBackend(WithCompute, SubscribeOnWait, SentinelBackend):
    """Celery's Redis Sentinel result backend, with the compute of the attempt that succeeded."""
