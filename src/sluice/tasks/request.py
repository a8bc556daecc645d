"""ComputeRequest: Celery's worker-side Request, taught what a killed pool process means.

Runs in the worker's main process. When the pool process running a task dies
(WorkerLostError), the watchdog's record (or the SIGKILL) tells a memory kill from a crash, and
the task's retry policy decides: publish the next attempt at a bigger size, or fail with
:class:`MemoryKilled` / the attempt history. It is part of the task (Celery reaches it through
``ComputeTask.Request``), so it lives beside the task class, not in ``workers/``.
"""

from __future__ import annotations

import logging
from typing import Any

from billiard.einfo import ExceptionInfo, ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery import states
from celery.worker.request import Request

from sluice.errors import AttemptFailed, MemoryKilled, WorkerLost
from sluice.tasks import memory_kill
from sluice.tasks.escalation import Attempt, end_attempt
from sluice.tasks.retry import Reason

log = logging.getLogger("sluice.worker")


class ComputeRequest(Request):
    """Celery's Request plus memory-kill handling."""

    def on_failure(self, exc_info: ExceptionInfo, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if not isinstance(exc, WorkerLostError) or self.task.backend.get_state(self.id) == states.SUCCESS:
            return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        try:
            reason, detail, error = self._why_lost(exc)
            attempt = Attempt.of(self.task, self.request_dict, self.delivery_info)
            outcome = end_attempt(self.task, self._context, attempt, reason, detail, self.hostname)
            if isinstance(outcome, AttemptFailed):
                return self._retried(outcome)
        except Exception as hook_error:  # sluice's own code: fail the task visibly, never leave it unacknowledged
            log.exception("task %s[%s]: could not decide its retry after %s", self.task.name, self.id, exc)
            outcome = WorkerLost(
                f"{exc}; sluice could not decide a retry ({type(hook_error).__name__}: "
                f"{hook_error}), so the task failed"
            )
            error = exc
        return super().on_failure(
            _exception_info(outcome or error, exc), send_failed_event=send_failed_event, return_ok=return_ok
        )

    def _why_lost(self, exc: WorkerLostError) -> tuple[Reason, str, BaseException]:
        kill = memory_kill.read(self.task.app.redis, self.id)
        if kill is not None:
            return Reason.MEMORY, kill.message, MemoryKilled(kill.message)
        if "SIGKILL" in str(exc):
            return Reason.MEMORY, "killed by SIGKILL (likely the kernel's OOM killer)", exc
        return Reason.LOST, str(exc), exc

    def _retried(self, outcome: AttemptFailed) -> None:
        """The next attempt is published: store RETRY (its info holds the history) and acknowledge."""
        self.task.backend.mark_as_retry(self.id, outcome, request=self._context)
        self.send_event("task-retried", exception=repr(outcome), traceback="")
        self.acknowledge()


def _exception_info(error: BaseException, cause: BaseException) -> ExceptionInfo:
    try:
        raise error from cause
    except BaseException:
        return ExceptionInfo()
