"""SluiceConsumer: Celery's consumer, which keeps every message it cannot run as a dead letter.

Celery rejects (and so deletes) a message it cannot decode, one without a task envelope, one
naming a task this worker has not registered and one whose fields are invalid. sluice keeps a
copy first, with the reason, in the dead-letter list of the queue it came from (see
``sluice._kombu``), so ``sluice dead-letters`` can show it and requeue it once the cause is
fixed. Celery's own handling then goes on unchanged (an unknown task is still marked failed
with ``NotRegistered``, so its caller gets an answer). Installed with the ``worker_consumer``
setting, so a plain ``celery -A app worker`` gets it too.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.worker.consumer import Consumer
from kombu.utils.json import dumps

from sluice import _kombu, transport

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
        self._keep(message, f"unregistered task {exc}")
        super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._keep(message, f"invalid task message: {type(exc).__name__}: {exc}")
        super().on_invalid_task(body, message, exc)

    def _keep(self, message: Any, reason: str) -> None:
        info = message.delivery_info or {}
        queue = str(info.get(transport.SOURCE_QUEUE) or info.get("routing_key") or "unknown")
        raw = dict(message._raw, properties=dict(message._raw["properties"], delivery_info={
            k: v for k, v in info.items() if k != transport.SOURCE_QUEUE}))  # the message as it was sent
        letter = _kombu.DeadLetter(reason[:500], queue, time.time(), dumps(raw).encode())
        try:
            _kombu.dead_letter(self.app.redis, _kombu.RedisLayout.of_app(self.app), letter)
        except Exception:
            log.exception("could not keep a dead letter of message %s", message.delivery_tag)
            return
        log.warning("moved message %s from %s to the dead letters: %s", message.delivery_tag, queue, reason)
