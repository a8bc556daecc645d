"""Celery's Redis result backend, and one more field in what it stores: the compute a task's
successful attempt ran with, so ``sluice.attempts()`` can say at which size a task succeeded
(the failed attempts' records carry theirs). It rides in the result meta Celery writes anyway
(``result_extended``), so it costs no round trip. The arguments that meta repeats are bounded
as Celery bounds ``argsrepr``: a task's arguments are kept as sent when small, else as a repr
cut to 1 KiB, so a call with a 60 MB argument stores and publishes a meta of a few KiB, not
60 MB twice (STARTED and SUCCESS); a task declared ``result_args=False`` keeps them out (a batch
chunk's are up to a thousand items, already in Redis). A meta still too big to publish (a big
return value) is stored and announced by a small notice, which the caller's consumer
(:mod:`sluice.queues.broker.result_consumer`) reads the stored meta for.
A sender subscribes to a task's result channel when it waits for the result, not when it
sends the task. And a state is stored in one round trip (``lua/store_result.lua``), not two.
Installed by the App as the backend for ``redis://``, ``rediss://`` and ``sentinel://`` URLs
(the loader's ``override_backends``), and the compute field alone for ``rpc://``."""

from __future__ import annotations

import functools
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend, SentinelBackend
from celery.backends.rpc import RPCBackend
from celery.exceptions import BackendStoreError
from celery.utils.saferepr import saferepr
from kombu.utils.encoding import bytes_to_str

from sluice.queues.broker import scripts
from sluice.queues.broker.result_consumer import PUBLISH_LIMIT, ComputeResultConsumer, Notice
from sluice.tasks import ledger
from sluice.tasks.base import CLAIMED, ComputeTask
from sluice.tasks.escalation import Attempt

#: What the App maps result backend URLs to, by scheme.
PATHS = {scheme: f"{__name__}:ComputeResultBackend" for scheme in ("redis", "rediss")} | {
    "sentinel": f"{__name__}:ComputeSentinelBackend",
    "rpc": f"{__name__}:ComputeRPCBackend",
}


class WithCompute:
    """Mixed into Celery's Redis backends: a ComputeTask's successful result names its compute,
    the state of one with ``result_args=False`` leaves out its arguments, and any task's
    arguments are kept as sent only when small (:meth:`_bound_arguments`)."""

    def _get_result_meta(
        self, result: Any, state: str, traceback: Any, request: Any, format_date: bool = True, encode: bool = False
    ) -> dict[str, Any]:
        meta: dict[str, Any] = super()._get_result_meta(  # type: ignore[misc]
            result, state, traceback, request, format_date=format_date, encode=encode
        )
        if request is None:
            return meta
        self._bound_arguments(meta)
        task = self.app.tasks.get(getattr(request, "task", None) or "")  # type: ignore[attr-defined]
        if not isinstance(task, ComputeTask):
            return meta
        if not task.result_args:
            meta.pop("args", None)
            meta.pop("kwargs", None)
        if state == states.SUCCESS:
            meta["compute"] = Attempt.of(task, request, getattr(request, "delivery_info", None)).compute.to_dict()
        return meta

    def _bound_arguments(self, meta: dict[str, Any]) -> None:
        """Arguments longer than Celery's ``argsrepr`` bound (1 KiB) become their repr cut to
        that bound, as the ``argsrepr`` Flower shows: the stored meta is kept for
        ``result_expires`` and published at every state, while the arguments are the caller's
        own. Small ones (nearly all) stay as sent, looked at no further than the bound."""
        for field, limit in self._argument_bounds:
            if field in meta and _longer_than(meta[field], limit):
                levels = self.app.conf.task_repr_maxlevels  # type: ignore[attr-defined]
                meta[field] = saferepr(meta[field], limit, maxlevels=levels)

    @functools.cached_property
    def _argument_bounds(self) -> tuple[tuple[str, int], ...]:
        """Celery's bounds of ``argsrepr`` and ``kwargsrepr``, read once (stored at every state)."""
        amqp = self.app.amqp  # type: ignore[attr-defined]
        return (("args", amqp.argsrepr_maxsize), ("kwargs", amqp.kwargsrepr_maxsize))


def _longer_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (JSON-like) takes more than about ``limit`` characters, found by
    reading no more of it than that: a 60 MB argument costs no more than a small one."""
    budget, pending = limit, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, (str, bytes)):
            budget -= len(item) + 2
        elif isinstance(item, (dict, list, tuple)):
            budget -= 2 * len(item) + 2  # the separators; a container's items are counted next
        else:
            budget -= 8
        if budget < 0:
            return True
        if isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple)):
            pending += item
    return False


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

    def _store_result(
        self, task_id: str, result: Any, state: str, traceback: Any = None, request: Any = None, **kwargs: Any
    ) -> Any:
        meta = self._get_result_meta(result=result, state=state, traceback=traceback, request=request)  # type: ignore[attr-defined]
        meta["task_id"] = bytes_to_str(task_id)
        value = self.encode(meta)  # type: ignore[attr-defined]
        if isinstance(value, str) and len(value) > self._MAX_STR_VALUE_SIZE:  # type: ignore[attr-defined]
            raise BackendStoreError("value too large for Redis backend", state=state, task_id=task_id)
        notice = ""
        if len(value) > PUBLISH_LIMIT:  # announced instead of published (sluice.queues.broker.result_consumer)
            notice = self.encode(Notice(meta["task_id"], state).encode())  # type: ignore[attr-defined]
        claim = self._claim_for(request) if state == states.STARTED else None
        key = self.get_key_for_task(task_id)  # type: ignore[attr-defined]
        _, previous = self.ensure(  # type: ignore[attr-defined]
            self._store_unless_succeeded, (key, value, notice, state, claim)
        )
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

    def _store_unless_succeeded(
        self, key: bytes, value: str, notice: str, state: str, claim: ledger.ClaimWrite | None
    ) -> list[Any]:
        # Celery's expiry: result_failure_expires for a failure, result_expires otherwise
        expires = self.failure_expires if state == states.FAILURE else self.expires  # type: ignore[attr-defined]
        args: list[Any] = [value, int(expires) if expires else "", notice]
        client = self.client  # type: ignore[attr-defined]
        if claim is None:
            return scripts.run(client, "store_result", [key], args)
        return scripts.run(client, "store_result", [key, claim.key], [*args, claim.value, claim.ttl])


class ComputeResultBackend(WithCompute, SubscribeOnWait, StoreInOneStep, RedisBackend):
    """Celery's Redis result backend, with the compute of the attempt that succeeded."""

    ResultConsumer = ComputeResultConsumer


class ComputeSentinelBackend(WithCompute, SubscribeOnWait, StoreInOneStep, SentinelBackend):
    """Celery's Redis Sentinel result backend, with the compute of the attempt that succeeded."""

    ResultConsumer = ComputeResultConsumer


class ComputeRPCBackend(WithCompute, RPCBackend):
    """Celery's ``rpc://`` backend (results sent back to the caller as messages), with the
    compute of the attempt that succeeded in the final state's message."""
