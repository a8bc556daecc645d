"""Celery's Redis result backend, and one more field in what it stores: the compute a task's
successful attempt ran with, so ``sluice.attempts()`` can say at which size a task succeeded
(the failed attempts' records carry theirs). It rides in the result meta Celery writes anyway
(``result_extended``), so it costs no round trip. A task declared ``result_args=False`` keeps
its arguments out of that meta (a batch chunk's are up to a thousand items, already in Redis).
A sender subscribes to a task's result channel when it waits for the result, not when it
sends the task. And a state is stored in one round trip (``lua/store_result.lua``), not two.
Installed by the App as the backend for ``redis://``, ``rediss://`` and ``sentinel://`` URLs
(the loader's ``override_backends``)."""

from __future__ import annotations

import functools
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend, SentinelBackend
from celery.exceptions import BackendStoreError
from kombu.utils.encoding import bytes_to_str

from sluice import _kombu
from sluice.tasks.base import CLAIMED, ComputeTask
from sluice.workers import ledger

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


class StoreInOneStep:
    """Mixed into Celery's Redis backends: a state is stored, unless a success is (Celery's rule,
    ``_store_result``), by one script instead of a GET and then a SET + PUBLISH pipeline; and a
    ComputeTask's STARTED state carries its delivery-ledger claim, which the task then reads from
    its request instead of making it (``ComputeTask._claim_delivery``). Three round trips fewer
    per task, and Celery's check and write can no longer be split by a concurrent store."""

    def _store_result(self, task_id: str, result: Any, state: str, traceback: Any = None, request: Any = None,
                      **kwargs: Any) -> Any:
        meta = self._get_result_meta(result=result, state=state, traceback=traceback, request=request)  # type: ignore[attr-defined]
        meta["task_id"] = bytes_to_str(task_id)
        value = self.encode(meta)  # type: ignore[attr-defined]
        if isinstance(value, str) and len(value) > self._MAX_STR_VALUE_SIZE:  # type: ignore[attr-defined]
            raise BackendStoreError("value too large for Redis backend", state=state, task_id=task_id)
        claim = self._claim_for(request) if state == states.STARTED else None
        _, previous = self.ensure(self._store_unless_succeeded,  # type: ignore[attr-defined]
                                  (self.get_key_for_task(task_id), value, state, claim))  # type: ignore[attr-defined]
        if claim is not None:
            setattr(request, CLAIMED, (ledger.Claim.load(previous),))
        return result

    def _claim_for(self, request: Any) -> ledger.ClaimWrite | None:
        """The claim to make with a STARTED state: only where results live in the Redis the
        ledger lives in (the broker's, ``app.redis``); elsewhere the task claims on its own."""
        if request is None or not self._results_in_broker:
            return None
        task = self.app.tasks.get(getattr(request, "task", None) or "")  # type: ignore[attr-defined]
        return task.delivery_claim(request) if isinstance(task, ComputeTask) else None

    @functools.cached_property
    def _results_in_broker(self) -> bool:
        """Whether results live in the broker's Redis (read once: two conf lookups were a tenth
        of the STARTED store)."""
        conf = self.app.conf  # type: ignore[attr-defined]
        return bool(conf.result_backend == conf.broker_url)

    def _store_unless_succeeded(self, key: bytes, value: str, state: str,
                                claim: ledger.ClaimWrite | None) -> list[Any]:
        # Celery's expiry: result_failure_expires for a failure, result_expires otherwise
        expires = self.failure_expires if state == states.FAILURE else self.expires  # type: ignore[attr-defined]
        args: list[Any] = [value, int(expires) if expires else ""]
        if claim is None:
            return self._store_script(keys=[key], args=args)  # type: ignore[no-any-return]
        return self._store_script(keys=[key, claim.key], args=[*args, claim.value, claim.ttl])  # type: ignore[no-any-return]

    @functools.cached_property
    def _store_script(self) -> Any:
        return _kombu.script(self.client, "store_result")  # type: ignore[attr-defined]


class ComputeResultBackend(WithCompute, SubscribeOnWait, StoreInOneStep, RedisBackend):
    """Celery's Redis result backend, with the compute of the attempt that succeeded."""


class ComputeSentinelBackend(WithCompute, SubscribeOnWait, StoreInOneStep, SentinelBackend):
    """Celery's Redis Sentinel result backend, with the compute of the attempt that succeeded."""
