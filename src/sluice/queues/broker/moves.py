"""Moving a message to another queue, written once.

A message moves when admission forwards it to the class that can hold it, when a packed worker
puts back one it has no room for, when the reaper sends a message waiting in a dead worker's
own queue home, and when a dead letter is requeued. Each move is one atomic step in Redis (a
held message: ``forward.lua``, see ``forwarding``; a waiting one: ``move_message.lua``), so a
message is never in both places nor in neither, and a moved message is rewritten one way
(:func:`routed_to`): the default exchange, the target queue as its routing key, and none of the
fields sluice's fetch added to its delivery info.
"""

from __future__ import annotations

from typing import Any

import redis

from sluice.queues.broker import scripts

#: The ``delivery_info`` field naming the queue a message was fetched from (routing keys do not
#: always name it), read where a message is kept as a dead letter or moved on.
SOURCE_QUEUE = "sluice_queue"
#: The ``delivery_info`` field of a message fetched from behind the head of its queue: how deep.
FETCH_DEPTH = "sluice_depth"
#: The ``delivery_info`` field of a message whose task is recorded as revoked (``sluice.queues.revokes``).
REVOKED = "sluice_revoked"


def source_queue(delivery_info: dict[str, Any] | None, default: str = "") -> str:
    """The queue a message was fetched from (its routing key if the fetch did not say)."""
    info = delivery_info or {}
    return str(info.get(SOURCE_QUEUE) or info.get("routing_key") or default)


def is_revoked(message: Any) -> bool:
    """Whether the fetch found a delivered message's task recorded as revoked."""
    return bool((message.delivery_info or {}).get(REVOKED))


def fetch_depth(message: Any) -> int:
    """How deep behind the head of its queue a delivered message was fetched (0: the head)."""
    return int((message.delivery_info or {}).get(FETCH_DEPTH, 0))


def as_sent(raw: dict[str, Any]) -> dict[str, Any]:
    """A message as kombu delivered it (its raw envelope), as it was sent: without the fields
    sluice's fetch added to its delivery info."""
    properties = raw["properties"]
    info = {k: v for k, v in properties["delivery_info"].items() if k not in (SOURCE_QUEUE, FETCH_DEPTH, REVOKED)}
    return dict(raw, properties=dict(properties, delivery_info=info))


def routed_to(raw: dict[str, Any], queue: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    """A message rewritten to go to ``queue`` (the default exchange, the queue as routing key),
    with new ``headers`` if given."""
    sent = as_sent(raw)
    properties = sent["properties"]
    moved = dict(
        sent,
        properties=dict(properties, delivery_info=dict(properties["delivery_info"], exchange="", routing_key=queue)),
    )
    if headers is not None:
        moved["headers"] = headers
    return moved


def forward(message: Any, queue: str, headers: dict[str, Any], put_back: int | None = None) -> bool:
    """Move a delivered message its worker holds to ``queue`` with new ``headers`` (or, with
    ``put_back``, that many messages behind the head of its own queue); False when it was no
    longer held (restored meanwhile). See ``ForwardingChannel.forward``."""
    return bool(message.channel.forward(message, queue, headers, put_back=put_back))


def move_waiting(client: redis.Redis, source: str, target: str, entry: bytes | str, moved: bytes | str) -> bool:
    """Take ``entry`` off the list ``source`` and push ``moved`` (the message rewritten for its
    target) to be taken next from the list ``target``, atomically; False when someone took the
    entry meanwhile."""
    return bool(scripts.run(client, "move_message", [source, target], [entry, moved]))
