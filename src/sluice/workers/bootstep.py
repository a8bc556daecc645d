"""The sluice worker bootstep: sizing, the GPU check, the intake, the memory watchdog and the
heartbeat (which also publishes the worker's tasks to the task catalog).

It is added to every :class:`sluice.App`'s worker blueprint, so ``celery -A app worker -Q
highmem`` gets exactly what ``sluice worker --queue highmem`` gets. As Celery's own steps do
(``w.pool``, ``w.hub``), it sets itself on the worker as ``worker.sluice``, where the steps of
capabilities add their heartbeat fields (:meth:`SluiceWorkerStep.add_heartbeat_fields`).
"""

from __future__ import annotations

import functools
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from celery import bootsteps, signals
from celery.worker import state

from sluice.errors import GpuUnavailable
from sluice.queues import task_catalog
from sluice.queues.catalog import ResourceClass
from sluice.tasks.escalation import Attempt
from sluice.tasks.heartbeat import WorkerBeat
from sluice.workers.gpu import gpu_count
from sluice.workers.heartbeat import Heartbeat
from sluice.workers.packing import Packing
from sluice.workers.reaper import OrphanReaper
from sluice.workers.watchdog import MemoryWatchdog, Watched

log = logging.getLogger("sluice.worker")

#: How long a stopping worker waits for its threads' last writes (the heartbeat key's removal):
#: with Redis unreachable they would wait out the outage; the worker exits without them.
STOP_WAIT = 2.0


class SluiceWorkerStep(bootsteps.StartStopStep):
    """Sizes the pool to the class's slots, refuses gpu classes without a GPU, and runs the
    memory watchdog, heartbeat and orphan reaper threads for the worker's lifetime."""

    label = "sluice"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, allow_no_gpu: bool = False, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.app = worker.app
        catalog = self.app.catalog
        queues = list(self.app.amqp.queues.consume_from or [self.app.conf.task_default_queue])
        self.queues = queues
        self.classes: list[ResourceClass] = [catalog.get(q) for q in queues if q in catalog]
        gpu_classes = [rc.name for rc in self.classes if rc.is_gpu]
        if gpu_classes and not allow_no_gpu and gpu_count() == 0:
            raise GpuUnavailable(
                f"this worker was asked to consume gpu class(es) {', '.join(gpu_classes)} but no GPU is "
                "visible (nvidia-smi found none; SLUICE_GPU_COUNT unset or 0). Run it on a GPU node, "
                "or pass --allow-no-gpu for development"
            )
        if len(self.classes) == 1 and not kwargs.get("concurrency") and not kwargs.get("autoscale"):
            worker.concurrency = worker.min_concurrency = self.classes[0].slots
        self.allow_no_gpu = allow_no_gpu
        packed = [rc for rc in self.classes if rc.pack]
        self.packing = Packing(packed[0]) if packed and len(self.classes) == 1 else None
        if packed and len(self.classes) > 1:
            log.warning(
                "packed class %s served beside other classes: its tasks run in fixed slots here", packed[0].name
            )
        self.intake = self.app.settings.intake_queue
        self.app.amqp.queues.select_add(self.intake)  # every worker drains the intake (see workers/admission)
        self._limits: dict[str, Watched] = {}
        self._heartbeat_fields: list[Callable[[], Mapping[str, Any]]] = []
        self.app.worker_instance = self.instance = uuid.uuid4().hex
        self.app.worker_node = worker.hostname
        self.threads: list[MemoryWatchdog | Heartbeat | OrphanReaper] = []
        worker.sluice = self

    def add_heartbeat_fields(self, fields: Callable[[], Mapping[str, Any]]) -> None:
        """A capability's step adds fields to every heartbeat (flat in its JSON; see WorkerBeat)."""
        self._heartbeat_fields.append(fields)

    def start(self, worker: Any) -> None:
        client, settings = self.app.redis, self.app.settings
        self.threads = [
            Heartbeat(
                client,
                worker.hostname,
                lambda: self._payload(worker),
                settings.heartbeat_interval,
                also=functools.partial(task_catalog.publish, found=task_catalog.entries_of(self.app, worker.hostname)),
            ),
            MemoryWatchdog(
                self._running,
                client,
                worker.hostname,
                settings.watchdog_interval,
                on_dead=lambda: self._pool_process_died(worker),
            ),
            OrphanReaper(self.app, client, self.instance, settings.reaper_interval, settings.orphan_grace),
        ]
        for thread in self.threads:
            thread.start()
        signals.worker_shutdown.connect(self._drained, sender=worker, weak=False)
        log.info(
            "sluice worker %s serving %s with %d slot(s); memory watchdog every %.0f ms",
            worker.hostname,
            ", ".join(rc.describe() for rc in self.classes) or ", ".join(self.queues),
            worker.concurrency,
            self.app.settings.watchdog_interval * 1000,
        )

    def stop(self, worker: Any) -> None:
        """Warm shutdown. Celery stops this step before the pool, whose own stop waits for the
        running tasks: only the reaper stops here. The heartbeat and the watchdog go on until those
        tasks end (a worker without a heartbeat is dead to its peers' reapers, which would put its
        running tasks back to run again; a task stays held to its memory limit), and stop on
        ``worker_shutdown``, which Celery sends once the pool has drained."""
        for thread in self.threads:
            if isinstance(thread, OrphanReaper):
                thread.stop()  # not waited for: a sweep has no last write to make

    def terminate(self, worker: Any) -> None:
        """Cold shutdown: the running tasks are being killed, so everything stops now."""
        signals.worker_shutdown.disconnect(self._drained, sender=worker)
        self._stop(*self.threads)

    def _drained(self, sender: Any = None, **_: Any) -> None:
        """``worker_shutdown``: the warm shutdown is done, no task runs, the rest can stop."""
        signals.worker_shutdown.disconnect(self._drained, sender=sender)
        self._stop(*self.threads)

    @staticmethod
    def _stop(*threads: MemoryWatchdog | Heartbeat | OrphanReaper) -> None:
        """Stop ``threads``, giving their last writes STOP_WAIT seconds in all, never more: a
        worker told to stop exits whether or not Redis answers."""
        for thread in threads:
            thread.stop()
        deadline = time.monotonic() + STOP_WAIT
        for thread in threads:
            thread.stop(wait=max(0.0, deadline - time.monotonic()))

    @staticmethod
    def _pool_process_died(worker: Any) -> None:
        """Ask the pool (on the event loop's thread) to reap and replace dead processes now; it
        otherwise notices some deaths only on its 5-second maintenance timer."""
        hub, pool = getattr(worker, "hub", None), getattr(worker, "pool", None)
        if hub is not None and pool is not None:
            hub.call_soon(pool.maintain_pool)

    def _payload(self, worker: Any) -> WorkerBeat:
        extra: dict[str, Any] = {}
        for fields in self._heartbeat_fields:
            extra.update(fields())
        return WorkerBeat(
            worker.hostname,
            self.instance,
            os.getpid(),
            tuple(self.queues),
            tuple(rc.name for rc in self.classes),
            worker.concurrency,
            tuple(req.id for req in _active_requests()),
            extra=extra,
        )

    def _running(self) -> list[Watched]:
        """The busy pool processes and each one's memory limit (computed once per task)."""
        active = [req for req in _active_requests() if req.worker_pid]
        ids = {req.id for req in active}
        for stale in set(self._limits) - ids:
            del self._limits[stale]
        watched = []
        for req in active:
            item = self._limits.get(req.id)
            if item is None or item.pid != req.worker_pid:
                item = self._limits[req.id] = self._watch(req)
            watched.append(item)
        return watched

    def _watch(self, req: Any) -> Watched:
        attempt = Attempt.of(req.task, req.request_dict or {}, req.delivery_info)
        queue = (req.delivery_info or {}).get("routing_key") or ""
        limit = attempt.compute.memory_bytes or 0
        if queue in self.app.catalog:
            limit = min(limit, self.app.catalog.get(queue).slot.memory_bytes or limit)
        return Watched(req.id, req.name, req.worker_pid, limit, queue or "?")


def _active_requests() -> list[Any]:
    """A snapshot of the worker's running requests (the set is mutated by the main thread)."""
    for _ in range(3):
        try:
            return list(state.active_requests)
        except RuntimeError:
            continue
    return []
