"""Ending an attempt: publish the next one (escalated and re-routed) or fail with the history.

Used from both sides of a worker: the pool process (a task raised) and the main process (the
pool process was killed, or a redelivered message shows its previous worker died mid-task).
The next attempt keeps the task id, so the caller's ``AsyncResult`` follows every attempt; the
attempt number and escalated compute travel in message headers, the history in Redis.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluice import keys
from sluice.compute import Compute
from sluice.errors import AttemptFailed, MemoryExhausted, RetriesExhausted, TaskFailed
from sluice.headers import FORWARDED, Headers
from sluice.queues.broker.layout import WorkerQueue, worker_queue
from sluice.tasks.history import append as append_history
from sluice.tasks.retry import AttemptRecord, Reason, RetryPolicy, decide, summarize
from sluice.tenants import split_queue

if TYPE_CHECKING:
    from sluice.tasks.base import ComputeTask

log = logging.getLogger("sluice.escalation")


@dataclass(frozen=True)
class Attempt:
    """The attempt a message represents: its number, size, queue, retry policy, stickiness and tenant."""

    number: int
    compute: Compute
    queue: str
    policy: RetryPolicy | None
    sticky: str | None = None  #: the home queue of a sticky message
    tenant: str | None = None  #: whose call it is (None: the default tenant)

    @classmethod
    def of(cls, task: ComputeTask, request: Any, delivery_info: dict[str, Any] | None) -> Attempt:
        """Read from a request (or its ``request_dict``): its headers win over the task's options.
        The queue is the class (a tenant's queue of it counts as the class; the next attempt's
        tenant travels in the headers)."""
        headers = Headers.read(request)
        compute = (
            headers.compute.inherit(task.app.default_compute)
            if headers.compute is not None
            else task.app.effective_compute(task.name)
        )
        return cls(
            headers.attempt,
            compute,
            split_queue((delivery_info or {}).get("routing_key") or "?")[0],  # a tenant's queue: its class
            headers.policy or task.retry_policy,
            headers.sticky,
            headers.tenant,
        )


def next_queue(task: ComputeTask, attempt: Attempt, compute: Compute, reason: Reason, worker: str) -> str | WorkerQueue:
    """Where the next attempt goes: back to the same live worker when sticky (its process died,
    not the worker), else the smallest class that fits the new size; a queue that is not a
    resource class (a run's private queue) is kept."""
    if attempt.sticky and reason in (Reason.LOST, Reason.MEMORY):
        return worker_queue(worker)
    if attempt.sticky:
        return attempt.sticky
    if attempt.queue in task.app.catalog:
        return task.app.catalog.route(compute, task.name).name
    return attempt.queue


def end_attempt(
    task: ComputeTask, context: Any, attempt: Attempt, reason: Reason, detail: str, worker: str
) -> TaskFailed | None:
    """Decide and act on an attempt that ended without a result.

    Returns :class:`AttemptFailed` after publishing the next attempt (store it as RETRY), a
    :class:`RetriesExhausted`/:class:`MemoryExhausted` when the policy is spent (store it as
    FAILURE), or None when the policy does not retry this reason (fail with the original error).
    """
    policy = attempt.policy
    decision = decide(policy, attempt.compute, attempt.number, reason)
    record = AttemptRecord(attempt.number, attempt.queue, attempt.compute, reason, detail, worker)
    history = append_history(task.app.redis, context.id, record)
    carried = [r.encode() for r in history]  # what the caller's exception holds
    if decision.retry:
        target = next_queue(task, attempt, decision.compute, reason, worker)
        travelling = policy if policy is not task.retry_policy else None  # a per-message policy travels on
        inherited = {k: v for k, v in (context.headers or {}).items() if k != FORWARDED}  # a new attempt, a new trail
        headers = {
            **inherited,
            **Headers(attempt.number + 1, decision.compute, travelling, attempt.sticky, tenant=attempt.tenant).encode(),
        }
        task.signature_from_request(
            context, queue=target, headers=headers, countdown=decision.countdown or None
        ).apply_async()
        if decision.compute != attempt.compute:
            task.app.redis.incr(keys.stat("escalations", attempt.queue))
        total = policy.max_attempts if policy else 1
        where = target if isinstance(target, str) else f"worker {worker} (sticky)"
        line = (
            f"task {task.name}[{context.id}] {history[-1].describe()}; retrying at "
            f"{decision.compute.memory} on {where} (attempt {attempt.number + 1} of {total})"
        )
        if decision.countdown:
            line += f" in {decision.countdown:.1f}s"
        log.warning(line)
        return AttemptFailed(line, carried)
    if decision.exhausted:
        error = MemoryExhausted if reason.memory_like else RetriesExhausted
        return error(summarize(task.name, history), carried)
    return None
