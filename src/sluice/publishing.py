"""What a publish on the sluice transport sends besides its message: its queue's bell token
(``ring``, and ``BellBatch`` for pipelined batches), and fanout messages (events, broadcasts)
on a connection that waits for no reply (``UnansweredPublisher``). See ``sluice.transport``."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

from sluice import keys

#: The most bell tokens a served queue keeps: enough to wake every idle worker of a class at
#: once. A publish only pushes its token; each fetch trims (``fetch.lua``).
BELL_CAP = 1000


def ring(pipe: Any, queue: str) -> Any:
    """Add a bell token for ``queue`` to a pipeline of kombu's (prefixed) client; returns the pipeline."""
    return pipe.lpush(keys.bell(queue), 1)


class BellBatch(kombu_redis.PublishBatch):
    """kombu's publish batch (``Producer.batch()``, ``delay_many``), ringing each queue's bell once
    per flush, one token per message up to the cap, instead of two commands per message: the
    same tokens, so the same idle workers wake."""

    def __init__(self, channel: Any, max_size: int) -> None:
        super().__init__(channel, max_size)
        self.bells: Counter[str] = Counter()

    def flush(self) -> None:
        for queue, count in self.bells.items():
            self.pipeline.lpush(keys.bell(queue), *[1] * min(count, BELL_CAP))
            self.pipeline.ltrim(keys.bell(queue), 0, BELL_CAP - 1)
        self.bells.clear()
        super().flush()

    def discard(self) -> None:
        self.bells.clear()
        super().discard()


class UnansweredPublisher:
    """A connection of its own on which Redis sends no replies (``CLIENT REPLY OFF``), for fanout
    publishes: nobody reads PUBLISH's answer (how many listened), and waiting for it was a second
    round trip in every ``.delay()`` (the task-sent event Flower shows). A lost connection is
    opened again once; after that the error goes to kombu, whose publish retry takes over."""

    def __init__(self, pool: Any) -> None:
        self.pool, self._connection, self._pid = pool, None, 0

    def publish(self, topic: str, payload: str) -> None:
        try:
            self._connected().send_command("PUBLISH", topic, payload, check_health=False)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            self.close()
            self._connected().send_command("PUBLISH", topic, payload, check_health=False)

    def _alive(self) -> bool:
        """Nothing ever arrives on a reply-less connection but its end (Redis restarted, or gone);
        checked before each send, since a write to a closed socket may still succeed once."""
        try:
            return not self._connection.can_read(timeout=0)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False

    def _connected(self) -> Any:
        if self._connection is not None and (self._pid != os.getpid() or not self._alive()):
            self.close()                                          # ended, or a fork's child: open its own
        if self._connection is None:
            connection = self.pool.make_connection()
            connection.connect()
            connection.send_command("CLIENT", "REPLY", "OFF", check_health=False)
            self._connection, self._pid = connection, os.getpid()
        return self._connection

    def close(self) -> None:
        if self._connection is not None and self._pid == os.getpid():
            self._connection.disconnect()
        self._connection = None
