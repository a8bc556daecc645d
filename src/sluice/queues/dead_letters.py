"""Reading and acting on dead letters: messages a worker could not run, kept per queue.

The transport and the worker's consumer put them there (see ``sluice.queues.broker.transport`` and
``sluice.workers.consumer``); ``sluice dead-letters`` is this module on a command line.
Entries are numbered from 0, newest first, as ``LRANGE`` reads them. An entry that does not
decode (another program's data in the list) keeps its number and is skipped, logged and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from sluice import entries
from sluice.errors import ConfigurationError
from sluice.queues.broker import bells
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.broker.letters import DeadLetter
from sluice.queues.broker.moves import move_waiting


@dataclass(frozen=True)
class QueueDeadLetters:
    """One queue's dead letters: how many are kept now, and how many there ever were."""

    queue: str
    kept: int
    total: int


def summary(client: redis.Redis, layout: RedisLayout) -> list[QueueDeadLetters]:
    """Every queue with dead letters now, or whose counter says it had some."""
    queues = sorted(_suffixes(client, layout.dead_letters("")) | _suffixes(client, layout.dead_letter_count("")))
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.llen(layout.dead_letters(queue))
        pipe.get(layout.dead_letter_count(queue))
    replies = pipe.execute()
    return entries.decode_each(
        "dead-letter count",
        zip(queues, replies[::2], replies[1::2]),
        lambda row: QueueDeadLetters(row[0], int(row[1]), int(row[2] or 0)),
    )


def _suffixes(client: redis.Redis, prefix: str) -> set[str]:
    """What follows ``prefix`` in the names of the keys that start with it (here: queue names)."""
    return set(
        entries.decode_each(
            "dead-letter key name",
            client.scan_iter(match=prefix + "*", count=1000),
            lambda key: key.decode()[len(prefix) :],
        )
    )


def read(
    client: redis.Redis, layout: RedisLayout, queue: str, start: int = 0, count: int = 20
) -> list[tuple[int, DeadLetter]]:
    """Up to ``count`` dead letters of ``queue`` from number ``start`` on, newest first, each with its number."""
    found = client.lrange(layout.dead_letters(queue), start, start + count - 1)
    return entries.decode_each(
        "dead letter",
        enumerate(found, start),
        lambda numbered: (numbered[0], DeadLetter.decode(entries.blob(numbered[1]))),
    )


def requeue(client: redis.Redis, layout: RedisLayout, queue: str, number: int | None = None) -> int:
    """Put dead letters back on their queue, to be taken next: one (``number``) or all of them.
    Returns how many went back (an entry another ``requeue`` or ``purge`` took meanwhile is skipped)."""
    if queue == layout.unacked_key:  # its letters are whole held entries, and its name a hash, not a queue
        raise ConfigurationError(
            f"the dead letters of {queue!r} are held entries that did not read as a message: they can be "
            "shown and purged, not requeued (there is no queue to put them back on)"
        )
    dead = layout.dead_letters(queue)
    found = entries.decode_each(
        "dead letter",
        _entries(client, dead, queue, number),
        lambda entry: (entry, DeadLetter.decode(entries.blob(entry))),
    )
    moved = 0
    for entry, letter in found:
        moved += move_waiting(client, dead, layout.queue_lists(letter.queue)[0], entry, letter.raw)
    if moved:  # wake idle workers, as a publish does
        bells.ring_times(client.pipeline(), layout.bell(queue), moved).execute()
    return moved


def purge(client: redis.Redis, layout: RedisLayout, queue: str, number: int | None = None) -> int:
    """Delete dead letters of ``queue`` for good: one (``number``) or all. Returns how many."""
    dead = layout.dead_letters(queue)
    if number is None:
        pipe = client.pipeline()
        pipe.llen(dead)
        pipe.delete(dead)
        count, _ = pipe.execute()
        return int(count)
    entry = _entries(client, dead, queue, number)[0]
    # redis-py types LREM's value as str; it sends bytes as they are
    return int(client.lrem(dead, 1, entry))  # type: ignore[arg-type]


def _entries(client: redis.Redis, dead: str, queue: str, number: int | None) -> list[bytes | str]:
    if number is None:
        return list(reversed(client.lrange(dead, 0, -1)))  # oldest first: they go back in order
    entry = client.lindex(dead, number)
    if entry is None:
        raise ConfigurationError(
            f"queue {queue!r} has no dead letter number {number} (it has {client.llen(dead)}, numbered from 0)"
        )
    return [entry]
