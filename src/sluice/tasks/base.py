"""ComputeTask: the Celery task base class that carries a task's declared compute."""

from __future__ import annotations

from celery import Task

from sluice.compute import Compute
from sluice.workers.request import ComputeRequest


class ComputeTask(Task):
    """Base of every task an :class:`sluice.App` declares.

    ``compute`` is the task's declared size (axes left unset inherit the app default);
    ``Request`` is sluice's worker-side request, which turns a memory kill into a
    :class:`sluice.errors.MemoryKilled` failure.
    """

    compute: Compute | None = None
    Request = ComputeRequest

    @property
    def effective_compute(self) -> Compute:
        """The declared compute with unset axes filled from the app's default compute."""
        return self.app.effective_compute(self.name)
