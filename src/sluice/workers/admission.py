"""Admission: a worker runs only what its class can hold, and forwards the rest.

Routing at publish is an optimisation: a sender may lack the task's code, be a plain Celery
client, or name a queue by hand, and ``celery control add_consumer`` can point a worker at any
queue. Admission is the guarantee. Every message is judged before Celery makes a request of it
(the task's ``Strategy``, Celery's per-task message handler):

* from the intake queue (Celery's default queue, where plain Celery clients publish): forwarded
  to the smallest class that fits the task;
* from a resource class whose slot cannot hold the task's effective compute (a 4Gi task on a
  2Gi ``cpu`` queue, a gpu task on a cpu queue): forwarded to the smallest class that fits;
* from any other queue (a batch run's private queue, a worker's own queue): run;
* revoked while this worker was not up to hear it (recorded in Redis, ``sluice.queues.revokes``):
  handed to Celery as one it heard of, which ends it ``REVOKED``;
* larger than its tenant's quota on its class (``sluice.tenants``; a plain producer's message,
  which no publish-time check saw): failed with :class:`~sluice.errors.OverQuota`.

On a packed worker, a message that may run is also checked against the room its running tasks
leave (``sluice.workers.packing``), and put back when it does not fit now.

The forward keeps the task id and headers and is one atomic move in Redis (``forward.lua``):
the message is never lost nor in two queues. A task no class can hold fails with
:class:`NoQueueFits`, and so does a forward back to a queue the message was already forwarded
from (workers whose class settings disagree), so a forward cannot loop. A worker also refuses to
consume a class its own size cannot serve (:func:`queue_refusal`, for ``add_consumer``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from celery.exceptions import InvalidTaskError
from celery.worker import state as worker_state
from celery.worker.strategy import default as celery_strategy

from sluice.compute import Compute
from sluice.errors import ConfigurationError, NoQueueFits
from sluice.headers import FORWARDED, Headers
from sluice.queues.broker import moves
from sluice.queues.catalog import Catalog
from sluice.tenants import DEFAULT_TENANT, is_tenant
from sluice.workers.gpu import gpu_count

log = logging.getLogger("sluice.worker")


@dataclass(frozen=True)
class Verdict:
    """Run the message here (neither field set), forward it, or fail its task."""

    forward_to: str | None = None
    error: ConfigurationError | None = None  #: NoQueueFits, or OverQuota


RUN = Verdict()


def decide(
    name: str,
    compute: Compute,
    source: str,
    catalog: Catalog,
    intake: str,
    trail: tuple[str, ...] = (),
    tenant: str = DEFAULT_TENANT,
) -> Verdict:
    """What to do with a message of task ``name`` that came from queue ``source``; ``trail``:
    the queues it was forwarded from before; ``tenant``: whose call it is (a task larger than
    its tenant's quota on its class fails: the fetch takes such a message only to end it)."""
    if source != intake and (source not in catalog or compute.fits_in(catalog.get(source).slot)):
        if source not in catalog:
            return RUN
        refusal = catalog.get(source).share(tenant).refusal(name, compute, source, tenant)
        return RUN if refusal is None else Verdict(error=refusal)
    try:
        target = catalog.route(compute, name).name
    except NoQueueFits as exc:
        return Verdict(error=exc)
    if target in trail:
        return Verdict(
            error=NoQueueFits(
                f"task {name} with {compute.describe()} was forwarded in a loop "
                f"({' -> '.join((*trail, source, target))}); "
                "the workers' resource class settings disagree"
            )
        )
    return Verdict(forward_to=target)


def source_queue(message: Any) -> str:
    """The queue a message was fetched from."""
    return moves.source_queue(message.delivery_info)


def forward(app: Any, message: Any, name: str, compute: Compute, target: str) -> None:
    """Move the held message to ``target`` (same id, its headers plus the trail) and say so."""
    source = source_queue(message)
    headers = dict(message.headers or {})
    headers[FORWARDED] = [*read_headers(message).forwarded, source]
    moved = moves.forward(message, target, headers)
    task_id = headers.get("id", "?")
    if not moved:
        log.warning("task %s[%s]: not forwarded, the message was restored to %s meanwhile", name, task_id, source)
        return
    if source in app.catalog:
        why = f"class {source} holds {app.catalog.get(source).slot.describe()}"
    else:
        why = f"it came from the intake queue {source}"
    log.info("task %s[%s] needs %s, %s: forwarded to %s", name, task_id, compute.describe(), why, target)


def fail(task: Any, message: Any, error: ConfigurationError) -> None:
    """End the task with ``error`` stored as its result (its caller's ``.get()`` raises it)."""
    task_id = (message.headers or {}).get("id")
    log.error("task %s[%s] failed without running: %s", task.name, task_id, error)
    task.backend.mark_as_failure(task_id, error)
    message.ack()


def read_headers(message: Any) -> Headers:
    """A message's sluice headers; bad ones are Celery's InvalidTaskError, which its consumer
    handles (sluice's keeps a dead letter) instead of stopping the worker."""
    try:
        return Headers.read(message.headers or {})
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # ConfigurationError is a ValueError
        raise InvalidTaskError(f"invalid sluice headers: {type(exc).__name__}: {exc}") from None


def strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Any:
    """``ComputeTask.Strategy``: Celery's message handler for ``task``, behind admission."""
    handle = celery_strategy(task, app, consumer, **kwargs)
    catalog, intake = app.catalog, app.settings.intake_queue
    packing = consumer.controller.sluice.packing  # a packed worker's room (None: fixed slots)
    inherited = app.inherited_compute(task.name)  # "auto" memory is resolved per message (from a cache)

    def admit(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **options: Any) -> Any:
        if moves.is_revoked(message):  # recorded in Redis: Celery ends it REVOKED, as one it heard of
            worker_state.revoked.add((message.headers or {}).get("id"))
            return handle(message, body, ack, reject, callbacks, **options)
        source = source_queue(message)
        if source != intake and source not in catalog:
            return handle(message, body, ack, reject, callbacks, **options)
        headers = read_headers(message)
        declared = headers.compute.inherit(app.default_compute) if headers.compute is not None else inherited
        compute = app.resolve(task.name, declared)
        tenant = headers.tenant if is_tenant(headers.tenant) else DEFAULT_TENANT
        verdict = decide(task.name, compute, source, catalog, intake, headers.forwarded, str(tenant))
        if verdict is RUN:
            if (
                packing is not None
                and source == packing.queue
                and not (message.headers or {}).get("eta")
                and not packing.admit(message, task.name, compute)
            ):
                return None  # put back (see sluice.workers.packing)
            return handle(message, body, ack, reject, callbacks, **options)
        try:
            if verdict.forward_to is not None:
                return forward(app, message, task.name, compute, verdict.forward_to)
            return fail(task, message, verdict.error)  # type: ignore[arg-type]  # not RUN, not a forward
        except consumer.connection_errors:
            raise
        except Exception as exc:  # sluice's own code: keep the message as a dead letter, never stop the worker
            log.exception("task %s: could not act on admission's verdict %s", task.name, verdict)
            raise InvalidTaskError(
                f"sluice could not forward or fail this message: {type(exc).__name__}: {exc}"
            ) from exc

    return admit


def queue_refusal(step: Any, queue: str) -> str | None:
    """Why this worker must not consume ``queue`` (None: it may): a class whose slot is bigger
    than every class the worker was started for, or a gpu class on a machine without a GPU."""
    catalog = step.app.catalog
    if queue not in catalog:
        return None
    wanted = catalog.get(queue)
    if wanted.is_gpu and not step.allow_no_gpu and gpu_count() == 0:
        return f"class {queue} needs a GPU and this machine has none"
    if step.classes and not any(wanted.slot.fits_in(own.slot) for own in step.classes):
        return (
            f"class {queue} has slots of {wanted.slot.describe()}, bigger than this worker's "
            f"({'; '.join(own.describe() for own in step.classes)})"
        )
    return None
