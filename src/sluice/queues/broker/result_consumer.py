"""The caller's side of sluice's Redis result backend: Celery's result consumer (the pub/sub
listener behind ``.get()``, joins and ``delay_many`` waits), made to return every result.

Two things stop Celery's from doing so, both seen against a real redis-server:

* **A result published while its subscription was down is lost.** Celery re-reads the stored
  states of the tasks it waits on when it reconnects, but *before* it subscribes again: a result
  stored in between is neither read nor received, and ``.get()`` waits out its timeout although
  the task succeeded. And where redis-py may retry (Celery's ``redis_retry_on_timeout``), it
  reconnects a pub/sub connection cut in the middle of a message on its own, subscribing again
  without any re-read. Here the stored states are read again after every reconnect, once the
  subscriptions are back.
* **A message bigger than Redis's pub/sub output buffer limit disconnects the subscriber**
  (``client-output-buffer-limit pubsub 32mb 8mb 60`` by default), taking every result it was
  waiting for with it. sluice's backend publishes a :class:`Notice` instead of a meta that big
  (:data:`PUBLISH_LIMIT`), and this consumer reads the stored meta when one arrives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from celery import states
from celery.backends.redis import ResultConsumer

from sluice import entries
from sluice.queues.broker.layout import result_meta

#: The largest meta published as it is, with room under Redis's default hard pub/sub limit
#: (32 MiB at once; the soft one, 8 MiB for a minute, a subscriber that reads trips only if it
#: stalls). A bigger one is stored and announced by a :class:`Notice`. Not lower: a plain Celery
#: caller reads only what is published, and stock Celery publishes anything under 32 MiB.
PUBLISH_LIMIT = 24 << 20


@dataclass(frozen=True)
class Notice:
    """What is published on a task's result channel instead of a meta too big to publish: the
    task's id and state; the meta is in the task's result key. It is a meta of its own,
    in a state that is not ready (:attr:`STATUS`), so a plain Celery consumer, which cannot
    read it, keeps waiting instead of taking it for the result."""

    task_id: str
    state: str

    STATUS: ClassVar[str] = "STORED"

    def encode(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "status": self.STATUS,
            "result": {"state": self.state},
            "traceback": None,
            "children": [],
            "date_done": None,
        }

    @classmethod
    def read(cls, meta: dict[str, Any]) -> Notice | None:
        """The notice ``meta`` is, or None for a meta that is not one."""
        if meta.get("status") != cls.STATUS or not isinstance(meta.get("result"), dict):
            return None
        return cls(str(meta.get("task_id")), str(meta["result"].get("state")))


class ComputeResultConsumer(ResultConsumer):
    """Celery's Redis result consumer that re-reads stored states after every reconnect (its
    own, and redis-py's silent one) and reads the stored meta a :class:`Notice` announces."""

    #: Set when the pub/sub connection came back: the stored states are read on the next drain.
    _stale = False

    def _consume_from(self, task_id: str) -> None:
        super()._consume_from(task_id)
        connection = self._pubsub.connection if self._pubsub is not None else None
        if connection is not None:  # kept as a weak method, registered once per connection
            connection.register_connect_callback(self._on_reconnect)

    def _on_reconnect(self, connection: Any) -> None:
        """redis-py reconnected the pub/sub connection (and subscribed again) inside a read."""
        self._stale = True

    def _reconnect_pubsub(self) -> None:
        super()._reconnect_pubsub()  # reads the stored states, then subscribes: read them again
        self._stale = True

    def drain_events(self, timeout: float | None = None) -> None:
        super().drain_events(timeout)
        if self._stale:
            self._ensure(self._reread, ())

    def _reread(self) -> None:
        """Hand on the stored state of every task still waited on: a result published while the
        subscription was down was received by no one, but it was stored first."""
        with self._locked():
            self._stale = False
            keys = list(self.subscribed_to)
            stored = [raw for raw in self.backend.client.mget(keys) if raw is not None] if keys else []
            # one result that does not decode is skipped (logged, counted): the others still reach their callers
            for meta in entries.decode_each("task result", stored, lambda raw: result_meta(self._decode_result, raw)):
                super().on_state_change(meta, None)

    def on_state_change(self, meta: dict[str, Any], message: Any) -> None:
        notice = Notice.read(meta) if message is not None else None
        if notice is not None and (notice.state in states.READY_STATES or self.on_message is not None):
            raw = self.backend.get(self._get_key_for_task(notice.task_id))
            if raw is None:  # expired before it was read: nothing to hand on
                return
            meta = self._decode_result(raw)
        super().on_state_change(meta, message)
