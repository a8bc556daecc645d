"""Packed workers: as many tasks at once as fit the worker, by each task's own compute.

A fixed-slot class gives every task a whole slot, so a task that declares 8Gi takes a 64Gi
slot and a 4-slot worker runs 4 tasks of 200Mi. A packed class (``ResourceClass(...,
pack=True)``) sizes the worker instead: its slot is the whole worker (the pod), and the worker
starts a message only when the message's effective compute fits what its running tasks leave
free on every axis (cpu, memory, gpu), up to ``slots`` tasks at once. The watchdog still holds
each task to its own limit, so a neighbour cannot take another's memory.

A message that does not fit now is put back where it was in its queue (one atomic move, see
``forward.lua``; never held hostage, never lost, acks stay late), where another worker with room
can take it. This worker then backfills: it fetches the message behind the ones it had no room
for (``fetch.lua`` reads its queue that deep) and starts it if it fits. Backfill is bounded, so a
big task is not starved by the small ones behind it: after ``slots`` messages have started past
the same head, or ``MAX_DEPTH`` messages in a row did not fit, or nothing is behind, the worker
fetches nothing until one of its running tasks ends; an end of one always sends it back to the
head of the queue, which starts as soon as enough tasks have finished. ETA messages are judged
when Celery holds them, not when they come due.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker import state

from sluice.compute import Compute
from sluice.queues.broker.moves import fetch_depth, forward
from sluice.queues.broker.qos import install_gate
from sluice.queues.catalog import ResourceClass
from sluice.tasks.escalation import Attempt

log = logging.getLogger("sluice.worker")


#: How many messages in a row, from the head of the queue, a worker may find without room before
#: it waits for a task to end instead (each costs a fetch and a put-back).
MAX_DEPTH = 8


class Packing:
    """The room left on one packed worker, and what its channel fetches next: the
    :class:`~sluice.queues.broker.qos.FetchGate` it installs on its channel."""

    def __init__(self, resource_class: ResourceClass) -> None:
        self.resource_class = resource_class
        self.queue = resource_class.name
        self.size = resource_class.slot
        self._computes: dict[str, Compute] = {}
        self._depth: int | None = 0  #: what to fetch next: nothing (None), the head (0), deeper
        self._running_then: frozenset[str] = frozenset()  #: the tasks running when a fetch was put off
        self._head: str | None = None  #: the delivery tag of the head message without room
        self._passes = 0  #: messages started past that head

    def used(self) -> tuple[int, int, int]:
        """Millicores, bytes and gpus of every request the worker holds (reserved or running)."""
        requests = list(state.reserved_requests)
        ids = {req.id for req in requests}
        for gone in set(self._computes) - ids:
            del self._computes[gone]
        millicores = memory = gpus = 0
        for req in requests:
            compute = self._computes.get(req.id)
            if compute is None:
                compute = self._computes[req.id] = Attempt.of(
                    req.task, req.request_dict or {}, req.delivery_info
                ).compute
            millicores += compute.millicores or 0
            memory += compute.memory_bytes or 0
            gpus += compute.gpus
        return millicores, memory, gpus

    def fits(self, compute: Compute) -> bool:
        """Would ``compute`` fit beside what runs now, on every axis?"""
        millicores, memory, gpus = self.used()
        return (
            millicores + (compute.millicores or 0) <= (self.size.millicores or 0)
            and memory + (compute.memory_bytes or 0) <= (self.size.memory_bytes or 0)
            and gpus + compute.gpus <= self.size.gpus
        )

    def admit(self, message: Any, name: str, compute: Compute) -> bool:
        """Whether to start ``message`` (from this class's queue) now; if not, it is put back
        where it was found, and the next fetch goes one message deeper or waits."""
        depth = fetch_depth(message)
        if self.fits(compute):
            if depth == 0:
                self._head, self._passes = None, 0  # the head starts: backfill may pass the next
            else:
                self._passes += 1
                if self._passes >= self.resource_class.slots:
                    self._wait_for_an_end()
            return True
        forward(message, self.queue, dict(message.headers or {}), put_back=depth)
        install_gate(message, self)  # its channel's fetches now follow depth()
        if depth == 0 and message.delivery_tag != self._head:
            self._head, self._passes = message.delivery_tag, 0
        if depth + 1 < MAX_DEPTH and self._passes < self.resource_class.slots:
            self._depth, self._running_then = depth + 1, self._running()
        else:
            self._wait_for_an_end()
        log.debug(
            "no room for task %s (%s) on %s: put back %d deep on %s; next fetch: %s",
            name,
            compute.describe(),
            self.size.describe(),
            depth,
            self.queue,
            self._depth,
        )
        return False

    def depth(self) -> int | None:
        """What the channel fetches next: None (nothing, until a task ends), 0 (the head of each
        queue) or d (the message d deep in this class's queue). An end of a task that was running
        when the head did not fit sends the next fetch back to the head."""
        if self._depth != 0 and self._running_then - self._running():
            self._depth, self._running_then = 0, frozenset()
        return self._depth

    def found_nothing(self) -> None:
        """The fetch deep in the queue found nothing: wait for a task to end."""
        self._wait_for_an_end()

    def _wait_for_an_end(self) -> None:
        running = self._running()
        self._depth, self._running_then = (None, running) if running else (0, frozenset())

    @staticmethod
    def _running() -> frozenset[str]:
        return frozenset(req.id for req in state.reserved_requests)
