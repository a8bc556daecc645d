"""What a publish on the sluice transport sends besides its message: its queue's bell token
(``ring``, and ``BellBatch`` for pipelined batches), and fanout messages (events, broadcasts)
on a connection that waits for no reply (``UnansweredPublisher``, through the channel mixin
``EventPublishing``). See ``sluice.transport``."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

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


class EventPublishing(kombu_redis.Channel):
    """The sluice channel's fanout publishes (events, broadcasts): on an :class:`UnansweredPublisher`,
    and Celery events (``sluice.events``) straight through ``basic_publish``."""

    #: Where fanout messages go (see ``_put_fanout``), made on the first.
    _unanswered: UnansweredPublisher | None = None

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any) -> None:
        """kombu's fanout publish (events, broadcasts), on a connection that waits for no reply
        (see :class:`UnansweredPublisher`); batched or key-prefixed ones go kombu's way."""
        if kwargs.get("_publish_batch") is not None or self.global_keyprefix:
            return super()._put_fanout(exchange, message, routing_key, **kwargs)
        if self._unanswered is None:
            self._unanswered = UnansweredPublisher(self.pool)
        payload = dumps(message)
        for topic in self._get_publish_topics(exchange, routing_key):
            self._unanswered.publish(topic, payload)

    def takes_events(self, exchange: str) -> bool:
        """Whether :meth:`publish_event` can publish to ``exchange`` here: declared on this
        channel (kombu's way did it once), and no key prefix to apply."""
        return not self.global_keyprefix and exchange in self.state.exchanges

    def publish_event(self, exchange: str, routing_key: str, event: dict[str, Any], headers: dict[str, Any] | None,
                      delivery_mode: int) -> None:
        """Publish a Celery event (see ``sluice.events``): the message kombu's Producer would
        make (JSON body, the dispatcher's headers and delivery mode), through ``basic_publish``."""
        message = self.prepare_message(dumps(event), None, "application/json", "utf-8", headers,
                                       {"delivery_mode": delivery_mode})
        self.basic_publish(message, exchange, routing_key)

    def close(self) -> None:
        if self._unanswered is not None:
            self._unanswered.close()
        super().close()
