"""The dead-letter record, written once: a message that could not be run, kept on its queue's
dead-letter list with why, when, and its bytes intact.

``fetch.lua`` writes the same record for a message whose envelope is not kombu's; a test holds
what it writes equal, field for field, to :meth:`DeadLetter.decode`. Reading and acting on the
lists (``sluice dead-letters``) is ``sluice.queues.dead_letters``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis
from kombu.utils.json import dumps

from sluice import entries
from sluice.queues.broker import scripts
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.broker.moves import as_sent, source_queue

#: The most dead letters kept per queue (the oldest are dropped; the counter keeps the total).
DEAD_LETTER_CAP = 10_000
#: The longest reason kept (an exception's text can be a whole message).
REASON_LIMIT = 500


@dataclass(frozen=True)
class DeadLetter:
    """A message that could not be run: why, the queue it came from, when, and its raw bytes.

    Stored as ``<JSON header>\\n<raw message>`` (``fetch.lua`` writes the same format), so a body
    that is not even text survives intact."""

    reason: str
    queue: str
    at: float
    raw: bytes

    @classmethod
    def now(cls, reason: str, queue: str, raw: bytes) -> DeadLetter:
        """A dead letter made now, its reason cut to :data:`REASON_LIMIT`."""
        return cls(reason[:REASON_LIMIT], queue, time.time(), raw)

    @classmethod
    def of_message(cls, message: Any, reason: str) -> DeadLetter:
        """The dead letter a delivered kombu message becomes: the message as it was sent, on the
        dead letters of the queue it was fetched from."""
        queue = source_queue(message.delivery_info, "unknown")
        return cls.now(reason, queue, dumps(as_sent(message._raw)).encode())

    def encode(self) -> bytes:
        header = json.dumps({"reason": self.reason, "queue": self.queue, "at": self.at})
        return header.encode() + b"\n" + self.raw

    @classmethod
    def decode(cls, entry: bytes) -> DeadLetter:
        header, _, raw = entry.partition(b"\n")
        fields = entries.loads(header)
        return cls(str(fields["reason"]), str(fields["queue"]), float(fields["at"]), raw)

    @property
    def task_id(self) -> str | None:
        try:
            return str(json.loads(self.raw)["headers"]["id"])
        except (ValueError, TypeError, KeyError):
            return None


def dead_letter(client: redis.Redis, layout: RedisLayout, letter: DeadLetter, held_tag: str | None = None) -> None:
    """Add a dead letter to its queue's list (and forget the held message it was, atomically)."""
    pipe = client.pipeline()
    _add_dead_letter(pipe, layout, letter, held_tag)
    pipe.execute()


def dead_letter_held(client: redis.Redis, layout: RedisLayout, tag: bytes, entry: bytes, reason: str) -> bool:
    """Make a held message that does not decode (``entry``, its unacked hash field) a dead letter,
    if it is still held as it was read (its holder may acknowledge it meanwhile; kombu's restore
    watches the hash the same way). False when it no longer was."""
    letter = unreadable_held(layout, entry, reason)
    key = layout.unacked()

    def put_aside(pipe: redis.client.Pipeline) -> bool:
        if pipe.hget(key, tag) != entry:
            return False
        pipe.multi()
        _add_dead_letter(pipe, layout, letter, tag)
        return True

    # redis-py types the callable as returning None, though value_from_callable=True returns its value
    return bool(client.transaction(put_aside, key, value_from_callable=True))  # type: ignore[arg-type]


def unreadable_held(layout: RedisLayout, entry: bytes, reason: str) -> DeadLetter:
    """The dead letter a held entry that does not decode becomes: its message on the dead letters
    of its queue, both read as kombu reads the entry, but with each byte that is not UTF-8 kept as
    it was instead of replaced (so ``show`` has the culprit, and ``requeue`` puts back what was
    taken); the whole entry, on the dead letters of the unacked hash's name, if not even that reads."""
    try:
        message, _exchange, queue = json.loads(entry.decode("utf-8", "surrogateescape"))
        raw = json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogateescape")
        queue.encode()  # names a key: must be text
    except entries.UNREADABLE:
        raw, queue = entry, layout.unacked_key
    return DeadLetter.now(reason, queue, raw)


def _add_dead_letter(
    pipe: redis.client.Pipeline, layout: RedisLayout, letter: DeadLetter, held_tag: str | bytes | None
) -> None:
    pipe.lpush(layout.dead_letters(letter.queue), letter.encode())
    pipe.ltrim(layout.dead_letters(letter.queue), 0, DEAD_LETTER_CAP - 1)
    pipe.incr(layout.dead_letter_count(letter.queue))
    if held_tag is not None:
        scripts.queue(pipe, "ack", layout.unhold_keys(), [held_tag])
