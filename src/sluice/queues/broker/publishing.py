"""What a publish on the sluice transport sends besides its message: its queue's bell token
(``BellBatch`` rings each queue's bell once per pipelined batch; see ``bells``), fanout messages
(events, broadcasts) on a connection that waits for no reply (``UnansweredPublisher``, through
the channel mixin ``EventPublishing``), and many messages that differ in a few strings encoded
from one template (``MessageTemplate``, with ``serialize`` and ``delivery_mode`` as kombu's
Producer has them). See ``sluice.queues.broker.transport``."""

from __future__ import annotations

import os
import re
from collections import Counter
from json.encoder import encode_basestring_ascii
from typing import Any

import redis
from kombu.entity import maybe_delivery_mode
from kombu.exceptions import OperationalError
from kombu.serialization import dumps as serialize_body
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps
from redis.connection import ConnectionInterface

from sluice.ids import new_id
from sluice.queues.broker import bells

#: What a publish raises when the broker cannot be reached (after kombu's retries).
PublishError = OperationalError


def serialize(body: Any, serializer: str) -> tuple[str, str, Any]:
    """``body`` encoded as kombu's Producer encodes a message body: content type, encoding, data."""
    content_type, content_encoding, data = serialize_body(body, serializer=serializer)
    return content_type, content_encoding, data


def delivery_mode(mode: Any) -> int | None:
    """The delivery mode kombu's Producer writes for ``mode`` (a name such as "persistent", or a number)."""
    return maybe_delivery_mode(mode)


class BellBatch(kombu_redis.PublishBatch):
    """kombu's publish batch (``Producer.batch()``, ``delay_many``), ringing each queue's bell once
    per flush, one token per message up to the cap, instead of two commands per message: the
    same tokens, so the same idle workers wake."""

    def __init__(self, channel: Any, max_size: int) -> None:
        super().__init__(channel, max_size)
        self.bells: Counter[str] = Counter()

    def flush(self) -> None:
        for queue, count in self.bells.items():
            bells.announce(self.pipeline, queue, count)
        self.bells.clear()
        super().flush()

    def discard(self) -> None:
        self.bells.clear()
        super().discard()

    def push(self, key: str, queue: str, payload: str) -> None:
        """Buffer one message already encoded for Redis (a :class:`MessageTemplate`'s) on the list
        ``key`` of ``queue``: what ``publish`` buffers for a message kombu routes to ``queue``."""
        self._check_usable()
        self.pipeline.lpush(key, payload)
        self.bells[queue] += 1
        self._buffered += 1
        if self._buffered >= self.max_size:
            self.flush()


class MessageTemplate:
    """A kombu message for ``queue`` encoded once, with slots for the strings that differ per
    call (the task id, ``argsrepr``, ...), the body and the delivery tag; each call's message is
    the template's text joined with its values, where re-encoding the whole message was a third
    of a bulk submit. kombu prepares and encodes the template (``basic_publish``'s augment, the
    JSON its Redis ``_put`` pushes), so the wire format stays kombu's own; a test holds a message
    from here equal to ``apply_async``'s. ``slot(name)`` is the placeholder to put in the
    message's headers or properties before :meth:`compile`. Not for queues with an expiry
    (kombu adds commands for those)."""

    def __init__(self, channel: Any, queue: str) -> None:
        self.channel, self.queue = channel, queue
        self._mark = f"@@{new_id()}:"  # random: no header a user sets can hold it
        self._parts: list[str] = []
        self.key = queue

    def slot(self, name: str) -> str:
        return f"{self._mark}{name}@@"

    def compile(self, message: dict[str, Any]) -> None:
        channel = self.channel
        channel._inplace_augment_message(message, "", self.queue)
        message["body"], message["properties"]["delivery_tag"] = self.slot("body"), self.slot("delivery_tag")
        self.key = channel._q_for_pri(self.queue, channel._get_message_priority(message, reverse=False))
        self._parts = re.split(f"{re.escape(self._mark)}(\\w+)@@", dumps(message))

    def encode(self, body: str, **strings: str) -> str:
        """One message: ``body`` serialized (kombu encodes it as it would), ``strings`` for the slots."""
        values = {name: encode_basestring_ascii(value)[1:-1] for name, value in strings.items()}
        values["body"] = self.channel.encode_body(body, self.channel.body_encoding)[0]
        values["delivery_tag"] = self.channel._next_delivery_tag()
        parts = self._parts
        return "".join(part if i % 2 == 0 else values[part] for i, part in enumerate(parts))


class UnansweredPublisher:
    """A connection of its own on which Redis sends no replies (``CLIENT REPLY OFF``), for fanout
    publishes: nobody reads PUBLISH's answer (how many listened), and waiting for it was a second
    round trip in every ``.delay()`` (the task-sent event Flower shows). A lost connection is
    opened again once; after that the error goes to kombu, whose publish retry takes over."""

    def __init__(self, pool: Any) -> None:
        self.pool, self._pid = pool, 0
        self._connection: ConnectionInterface | None = None

    def publish(self, topic: str, payload: str) -> None:
        try:
            self._connected().send_command("PUBLISH", topic, payload, check_health=False)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            self.close()
            self._connected().send_command("PUBLISH", topic, payload, check_health=False)

    @staticmethod
    def _alive(connection: ConnectionInterface) -> bool:
        """Nothing ever arrives on a reply-less connection but its end (Redis restarted, or gone);
        checked before each send, since a write to a closed socket may still succeed once."""
        try:
            return not connection.can_read(timeout=0)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False

    def _connected(self) -> ConnectionInterface:
        if self._connection is not None and (self._pid != os.getpid() or not self._alive(self._connection)):
            self.close()  # ended, or a fork's child: open its own
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

    def publish_event(
        self, exchange: str, routing_key: str, event: dict[str, Any], headers: dict[str, Any] | None, delivery_mode: int
    ) -> None:
        """Publish a Celery event (see ``sluice.events``): the message kombu's Producer would
        make (JSON body, the dispatcher's headers and delivery mode), through ``basic_publish``."""
        message = self.prepare_message(
            dumps(event), None, "application/json", "utf-8", headers, {"delivery_mode": delivery_mode}
        )
        self.basic_publish(message, exchange, routing_key)

    def close(self) -> None:
        if self._unanswered is not None:
            self._unanswered.close()
        super().close()
