"""Packed workers: as many tasks at once as fit the worker, by each task's own compute.

A fixed-slot class gives every task a whole slot, so a task that declares 8Gi takes a 64Gi
slot and a 4-slot worker runs 4 tasks of 200Mi. A packed class (``ResourceClass(...,
pack=True)``) sizes the worker instead: its slot is the whole worker (the pod), and the worker
starts a message only when the message's effective compute fits what its running tasks leave
free on every axis (cpu, memory, gpu), up to ``slots`` tasks at once. The watchdog still holds
each task to its own limit, so a neighbour cannot take another's memory.

A message that does not fit now is put back at the head of its queue (one atomic move, see
``forward.lua``; never held hostage, never lost, acks stay late), where another worker with room
can take it, and this worker fetches nothing more until one of its running tasks has ended (a
gate on its channel's QoS). It then takes the head message again, so a big task is not passed
over by the small ones behind it: it starts as soon as enough of them have finished. ETA
messages are judged when Celery holds them, not when they come due.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker import state

from sluice.compute import Compute
from sluice.queues.catalog import ResourceClass
from sluice.tasks.escalation import Attempt

log = logging.getLogger("sluice.worker")


class Packing:
    """The room left on one packed worker, and the gate that pauses fetching while there is none."""

    def __init__(self, resource_class: ResourceClass) -> None:
        self.resource_class = resource_class
        self.size = resource_class.slot
        self._computes: dict[str, Compute] = {}
        self._waiting_for: frozenset[str] | None = None   #: the tasks running when a message was put back

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
                compute = self._computes[req.id] = Attempt.of(req.task, req.request_dict or {}, req.delivery_info).compute
            millicores += compute.millicores or 0
            memory += compute.memory_bytes or 0
            gpus += compute.gpus
        return millicores, memory, gpus

    def fits(self, compute: Compute) -> bool:
        """Would ``compute`` fit beside what runs now, on every axis?"""
        millicores, memory, gpus = self.used()
        return (millicores + (compute.millicores or 0) <= (self.size.millicores or 0)
                and memory + (compute.memory_bytes or 0) <= (self.size.memory_bytes or 0)
                and gpus + compute.gpus <= self.size.gpus)

    def put_back(self, message: Any, queue: str, name: str, compute: Compute) -> None:
        """Return the message to the head of ``queue`` and stop fetching until a task ends."""
        message.channel.forward(message, queue, dict(message.headers or {}), put_back=True)
        self._waiting_for = frozenset(req.id for req in state.reserved_requests) or None  # none: nothing to wait for
        message.channel.qos.gate = self.has_room
        log.debug("no room for task %s (%s) beside %d task(s) on %s: put back on %s until one ends", name,
                  compute.describe(), len(self._waiting_for or ()), self.size.describe(), queue)

    def has_room(self) -> bool:
        """The gate: False from a put-back until one of the tasks running then has ended."""
        if self._waiting_for is None:
            return True
        if self._waiting_for - {req.id for req in state.reserved_requests}:
            self._waiting_for = None
            return True
        return False
