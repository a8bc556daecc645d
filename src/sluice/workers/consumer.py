"""SluiceConsumer: Celery's consumer, which keeps every message it cannot run as a dead letter,
forwards a task it lacks the code of where the task catalog says it fits, refuses to
consume a class it cannot serve (``add_consumer``; see ``sluice.workers.admission``), and
keeps no per-worker bucket for a rate the cluster holds (``sluice.tasks.limits``).

Celery rejects (and so deletes) a message it cannot decode, one without a task envelope, one
naming a task this worker has not registered and one whose fields are invalid. sluice keeps a
copy first, with the reason, in the dead-letter list of the queue it came from (see
``sluice.queues.broker.letters``), so ``sluice dead-letters`` can show it and requeue it once the cause is
fixed. Celery's own handling then goes on unchanged (an unknown task is still marked failed
with ``NotRegistered``, so its caller gets an answer). Installed with the ``worker_consumer``
setting, so a plain ``celery -A app worker`` gets it too.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker.consumer import Consumer

from sluice.queues.broker.layout import RedisLayout
from sluice.queues.broker.letters import DeadLetter, dead_letter
from sluice.queues.status import message_compute
from sluice.tasks.limits import RATE_OPTION
from sluice.workers import admission

log = logging.getLogger("sluice.worker")


class SluiceConsumer(Consumer):
    """Celery's consumer; each of its "cannot run this message" handlers keeps a dead letter first."""

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        self._keep(message, f"cannot decode: {type(exc).__name__}: {exc}")
        super().on_decode_error(message, exc)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        self._keep(message, "not a Celery task message (no task header)")
        super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        try:
            if self._forward_by_catalog(message):
                return
        except self.connection_errors:
            raise
        except Exception:  # bad headers, an unreadable catalog: kept as a dead letter below
            log.exception("could not forward unregistered task message %s by the task catalog", message.delivery_tag)
        self._keep(message, f"unregistered task {exc}")
        super().on_unknown_task(body, message, exc)

    def bucket_for_task(self, type: Any) -> Any:
        """Celery's per-worker token bucket of a task's ``rate_limit``, unless the cluster holds the
        rate (``sluice.tasks.limits``): then the fetch script spaces the task's starts, and a
        bucket here would only hold messages back in this worker's memory."""
        if getattr(type, "cluster_limits", {}).get(RATE_OPTION) is not None:
            return None
        return super().bucket_for_task(type)

    def add_task_queue(self, queue: str, *args: Any, **kwargs: Any) -> None:
        """Celery's ``add_consumer``, refused for a class this worker cannot serve (admission)."""
        refusal = admission.queue_refusal(self.controller.sluice, queue)
        if refusal is not None:
            log.error("not consuming from %s: %s", queue, refusal)
            return
        super().add_task_queue(queue, *args, **kwargs)

    def _forward_by_catalog(self, message: Any) -> bool:
        """A task this worker lacks the code of, on a queue that is not its class (the intake, a
        wrong class), goes where the task catalog says it fits; True when it was forwarded."""
        headers = message.headers or {}
        source = admission.source_queue(message)
        entry = self.app.task_directory.get(str(headers.get("task")))
        if entry is None:
            return False
        trail = admission.read_headers(message).forwarded
        compute = message_compute(self.app, {"headers": headers})
        verdict = admission.decide(entry.name, compute, source, self.app.catalog, self.app.settings.intake_queue, trail)
        if verdict.forward_to is None:
            return False
        admission.forward(self.app, message, entry.name, compute, verdict.forward_to)
        return True

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._keep(message, f"invalid task message: {type(exc).__name__}: {exc}")
        super().on_invalid_task(body, message, exc)

    def _keep(self, message: Any, reason: str) -> None:
        letter = DeadLetter.of_message(message, reason)
        try:
            dead_letter(self.app.redis, RedisLayout.of_app(self.app), letter)
        except Exception:
            log.exception("could not keep a dead letter of message %s", message.delivery_tag)
            return
        log.warning("moved message %s from %s to the dead letters: %s", message.delivery_tag, letter.queue, reason)
