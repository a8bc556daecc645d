"""Acknowledgements and the fetch gate of the sluice transport's channel.

kombu's Redis QoS writes a message to the unacked hash when it is delivered, and removes it with
a round trip of its own per ack. Here ``fetch.lua`` has already written it, and acks are carried
to Redis by the channel's next fetch (:class:`AckCarrying`), or sent at once when no fetch
follows soon. A packed worker (``sluice.workers.packing``) decides what its channel fetches
next through a :class:`FetchGate`, installed with :func:`install_gate`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from sluice.queues.broker import scripts
from sluice.queues.broker.layout import RedisLayout

log = logging.getLogger("sluice.transport")


class FetchGate(Protocol):
    """What a channel fetches next, for a worker that does not take every message it can hold."""

    #: The queue whose lists a deeper fetch reads.
    queue: str

    def depth(self) -> int | None:
        """None: fetch nothing (until something changes); 0: the head of each queue, as always;
        d: the message d deep in :attr:`queue`."""

    def found_nothing(self) -> None:
        """The fetch deep in :attr:`queue` found nothing there."""


def install_gate(message: Any, gate: FetchGate) -> None:
    """Have the channel that delivered ``message`` fetch as ``gate`` says from now on."""
    message.channel.qos.gate = gate


class ReliableQoS(kombu_redis.QoS):
    """kombu's ack emulation, minus the unacked write the fetch script has already made, with
    acks carried to Redis by the channel's next fetch; and a ``gate`` a packed worker sets, so
    its channel fetches nothing while it has no room, or fetches from behind the head."""

    gate: FetchGate | None = None  #: what to fetch next (see FetchGate); None: the head, always

    def can_consume(self) -> bool:
        able = super().can_consume() and (self.gate is None or self.gate.depth() is not None)
        if not able:
            self.channel.flush_acks()  # no fetch will carry them
        return able

    def ack(self, delivery_tag: str) -> None:
        """Acknowledged here at once (the slot is free); in Redis by the next fetch (``fetch.lua``)
        when one follows at once, else now (:meth:`AckCarrying.flush_acks`): a channel
        waiting on its bells (for up to a second), consuming nothing (a warm shutdown) or closed
        fetches nothing soon, and a finished task's message held much longer than its heartbeat
        says it runs would be put back by a reaper. A worker killed in between leaves the
        message held, as one killed just before kombu's ack would: the reaper puts it back and
        the delivery ledger sees the attempt ended."""
        channel = self.channel
        channel.pending_acks.append(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)
        if channel._waiting or not channel.active_queues or channel.closed:
            channel.flush_acks()

    def restore_by_tag(self, tag: str, client: Any = None, leftmost: bool = False) -> None:
        """kombu's restore of a held message (a closing channel, the visibility timeout, the
        orphan reaper), as one atomic move that lets its tenant's charge go with it
        (``Forwarding.restore_held``); an entry that does not read goes kombu's way."""
        channel = self.channel
        with channel.conn_or_acquire(client) as conn:
            entry = conn.hget(self.unacked_key, tag)
        if entry is None:
            return  # no longer held: acknowledged or restored meanwhile
        try:
            message, exchange, routing_key = loads(bytes_to_str(entry))
            channel.restore_held(tag, message, exchange, routing_key, leftmost)
        except channel.connection_errors:
            raise
        except Exception:
            super().restore_by_tag(tag, client, leftmost)

    def restore_unacked(self, client: Any = None) -> None:
        """kombu's (a closing channel, or its process exiting, puts back what it holds), after
        the acknowledgements still pending are sent: an acknowledged message is never put back."""
        self.channel.flush_acks()
        self._flush()  # forget the acknowledged ones here too
        super().restore_unacked(client)

    def append(self, message: Any, delivery_tag: str) -> None:
        if delivery_tag in self.channel.fetched:
            self.channel.fetched.discard(delivery_tag)
            virtual.QoS.append(self, message, delivery_tag)  # in memory only: Redis has it
        else:
            super().append(message, delivery_tag)

    def held_tags(self) -> list[str]:
        """The delivery tags this channel holds unacknowledged now."""
        return [tag for tag in list(self._delivered) if tag not in self._dirty]

    def forget(self, delivery_tag: str) -> None:
        """Drop a tag from the in-memory state (its message went to the dead letters, or was moved)."""
        if delivery_tag in self._delivered:
            virtual.QoS.ack(self, delivery_tag)


class AckCarrying(kombu_redis.Channel):
    """The channel's side of :class:`ReliableQoS`: the acks no fetch has carried yet."""

    QoS = ReliableQoS
    layout: RedisLayout
    _plain_client: Callable[[], Any]  #: a client naming keys in full (``Forwarding``)
    #: Puts a held message back on its queue atomically (``Forwarding``).
    restore_held: Callable[[str, dict[str, Any], str, str, bool], None]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: Tags acknowledged here and not yet in Redis (see ``ReliableQoS.ack``); the fetch in
        #: flight carries ``_acks_in_flight`` of them.
        self.pending_acks: list[str] = []
        self._acks_in_flight = 0
        super().__init__(*args, **kwargs)

    def flush_acks(self) -> None:
        """Send the acknowledgements no fetch has carried (one round trip; none when there are none).
        With Redis unreachable they stay held there: the reaper puts them back, and the delivery
        ledger keeps them from running again."""
        carried = self._acks_in_flight if self._in_poll else 0  # no fetch in flight carries any
        tags = self.pending_acks[carried:]
        if not tags:
            return
        try:
            scripts.run(self._plain_client(), "ack", self.layout.unhold_keys(), tags)
        except self.connection_errors:
            log.warning("could not acknowledge %d message(s) in Redis: unreachable; will try again", len(tags))
            return
        del self.pending_acks[carried : carried + len(tags)]

    def close(self) -> None:
        self.flush_acks()
        super().close()
