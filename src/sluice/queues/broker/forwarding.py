"""Where a message the sluice channel holds goes other than its consumer: to another queue
(``forward.lua``: admission sends a task its class cannot hold to the class that can, and a
packed worker puts back one it has no room for, each never in both queues nor in neither), or
to the dead letters (one the worker cannot even decode or deliver; ``fetch.lua`` keeps those
whose envelope is not kombu's). Neither reaches Celery's consumer, so no message can stop a worker.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps
from redis.exceptions import ConnectionError as RedisConnectionError

from sluice import keys
from sluice.headers import TENANT
from sluice.queues.broker import bells, scripts
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.broker.letters import DeadLetter, dead_letter
from sluice.queues.broker.moves import routed_to, source_queue
from sluice.tenants import DEFAULT_TENANT, is_tenant, split_queue, tenant_queue

log = logging.getLogger("sluice.transport")


class Forwarding(kombu_redis.Channel):
    """The channel's moves of a held message: :meth:`forward`, :meth:`dead_letter_fetched`."""

    layout: RedisLayout
    fetched: set[str]
    #: A client that adds no key prefix (the layout names keys in full), made once per pool.
    _full_key_client: redis.Redis | None = None

    def forward(self, message: Any, queue: str, headers: dict[str, Any], put_back: int | None = None) -> bool:
        """Move a message this channel holds to ``queue`` with new ``headers``, atomically
        (``forward.lua``), and forget it here; False when it was no longer held (restored).
        Its routing becomes the default exchange and the queue's name (its tenant's queue of
        it, see ``sluice.tenants``), as the reaper's moves. ``put_back``: that many messages
        behind the head of its own queue, uncounted (a packed worker without room)."""
        raw, tag = message._raw, message.delivery_tag
        source = source_queue(raw["properties"]["delivery_info"], "?")
        tenant = headers.get(TENANT)
        queue = tenant_queue(queue, tenant) if isinstance(tenant, str) and is_tenant(tenant) else queue
        payload = routed_to(raw, queue, headers)
        counter = "" if put_back is not None else f"{source} {split_queue(queue)[0]}"
        moved = self._move_held(tag, payload, queue, counter, "" if put_back is None else put_back)
        self.fetched.discard(tag)
        self.qos.forget(tag)
        return moved

    def restore_held(self, tag: str, payload: dict[str, Any], exchange: str, routing_key: str, leftmost: bool) -> None:
        """kombu's restore of a held message (marked redelivered; back at the head of its queue,
        or with ``leftmost`` at its tail), as one atomic move (``forward.lua``)."""
        try:
            payload["headers"]["redelivered"] = True
            payload["properties"]["delivery_info"]["redelivered"] = True
        except (KeyError, TypeError):
            pass
        queue = self._lookup(exchange, routing_key)[0]
        self._move_held(tag, payload, queue, "", "" if leftmost else 0)

    def _move_held(self, tag: str, payload: dict[str, Any], queue: str, counter: str, depth: int | str) -> bool:
        """Run ``forward.lua``: the held ``tag`` becomes ``payload`` on ``queue`` (see there)."""
        target = self._q_for_pri(queue, self._get_message_priority(payload, reverse=False))
        home, tenant = split_queue(queue)
        layout = self.layout
        moved = scripts.run(
            self._plain_client(),
            "forward",
            [
                *layout.unhold_keys()[:2],
                layout.key(target),
                layout.bell(home),
                layout.key(keys.FORWARDED),
                *layout.unhold_keys()[2:],
                layout.tenant_lines(home),
            ],
            [tag, dumps(payload), bells.BELL_CAP, counter, depth, "" if tenant == DEFAULT_TENANT else tenant],
        )
        return bool(moved)

    def dead_letter_fetched(self, tag: str, queue: str, raw: bytes, exc: Exception) -> None:
        """Keep a fetched message that could not be delivered as a dead letter, and forget it here."""
        self.fetched.discard(tag)
        self.qos.forget(tag)
        letter = DeadLetter.now(f"{type(exc).__name__}: {exc}", queue, raw)
        dead_letter(self._plain_client(), self.layout, letter, held_tag=tag)
        log.warning("moved message %s from %s to the dead letters: %s: %s", tag, queue, type(exc).__name__, exc)

    def _plain_client(self) -> redis.Redis:
        """A client on this channel's pool that names keys in full (kombu's would prefix them again);
        a connection error once the channel's connection released its transport (see
        ``ReliableChannel.conn_or_acquire``)."""
        if self.connection.client is None:
            raise RedisConnectionError("this channel's broker connection was released")
        client = self._full_key_client
        if client is None or client.connection_pool is not self.pool:
            client = self._full_key_client = redis.Redis(connection_pool=self.pool)
        return client
