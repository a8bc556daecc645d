"""sluice's kombu transport: kombu's Redis transport with reliable fetch, dead letters and leases.

Every :class:`sluice.App` uses it (``broker_transport = "sluice"``), so a plain
``celery -A app worker`` gets it too.
What it changes, and why (the key layout is in ``sluice.queues.broker.layout``):

* **Reliable fetch.** kombu's BRPOP removes a message from Redis before the worker records it as
  unacknowledged, so a worker killed in between loses it for good. Here a worker takes a message
  with ``fetch.lua``, which moves it into kombu's unacked hash in the same atomic step; from
  then on the orphan reaper and kombu's own restore can always give it back.
* **Bells.** A Lua script cannot block, so an idle worker blocks on its queues' *bells* (a token
  pushed with every publish) and then fetches. A message from a producer that does not ring
  (a plain Celery client) is found by the next fetch, at most ``brpop_timeout`` (1 s) later.
* **Dead letters.** A message whose envelope is not kombu's is moved to its queue's dead-letter
  list by the script; one that the worker cannot even decode or deliver is moved there from
  Python. Neither reaches Celery's consumer, so no message can stop a worker.
* **Forwarding.** A worker moves a message it holds to another queue in one atomic step
  (``forward.lua``): admission (``sluice.workers.admission``) sends a task its class cannot
  hold on to the class that can, and it is never in both queues nor in neither.
* **Leases.** A worker renews the delivery time of every message it holds (ETA tasks waiting
  for their time included), so kombu's visibility timeout restores only messages whose holder
  stopped renewing: an ETA or a task longer than the visibility timeout still runs once.
"""

from __future__ import annotations

import hashlib
import logging
import time
from queue import Empty
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import redis
from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
from redis.exceptions import NoScriptError

from sluice import keys, redis_client
from sluice.queues.broker import layout as _kombu
from sluice.ids import new_id
from sluice.queues.broker.publishing import BELL_CAP, BellBatch, EventPublishing, ring

if TYPE_CHECKING:
    from sluice.workers.packing import Packing

log = logging.getLogger("sluice.transport")

#: The alias every sluice App names in ``broker_transport`` (``SENTINEL_ALIAS`` for ``sentinel://``).
ALIAS, SENTINEL_ALIAS = "sluice", "sluice-sentinel"
FETCH = _kombu.lua_source("fetch")
FETCH_SHA = hashlib.sha1(FETCH.encode()).hexdigest()
FORWARD = _kombu.lua_source("forward")
#: The transport option that sets the lease renewal interval (seconds; see :func:`lease_interval`).
LEASE_OPTION = "sluice_lease_interval"
#: The ``delivery_info`` field naming the queue a message was fetched from (routing keys do not
#: always name it), read where a message is kept as a dead letter.
SOURCE_QUEUE = "sluice_queue"
#: The ``delivery_info`` field of a message fetched from behind the head of its queue: how deep.
FETCH_DEPTH = "sluice_depth"


class ReliableQoS(kombu_redis.QoS):
    """kombu's ack emulation, minus the unacked write the fetch script has already made, with
    acks carried to Redis by the channel's next fetch; and a ``gate`` a packed worker sets, so
    its channel fetches nothing while it has no room, or fetches from behind the head."""

    gate: Packing | None = None   #: what to fetch next: nothing (None), the head (0), or deeper

    def can_consume(self) -> bool:
        able = super().can_consume() and (self.gate is None or self.gate.depth() is not None)
        if not able:
            self.channel.flush_acks()  # no fetch will carry them
        return able

    def ack(self, delivery_tag: str) -> None:
        """Acknowledged here at once (the slot is free); in Redis by the next fetch (``fetch.lua``)
        when one follows at once, else now (:meth:`ReliableChannel.flush_acks`): a channel
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
        """Drop a tag from the in-memory state (its message went to the dead letters)."""
        if delivery_tag in self._delivered:
            virtual.QoS.ack(self, delivery_tag)


class ReliableChannel(EventPublishing, kombu_redis.Channel):
    """A Redis channel that fetches with ``fetch.lua`` and waits on bells (see the module docstring)."""

    QoS = ReliableQoS
    #: The next poll command: the fetch script (False) or a wait on the bells (True).
    _waiting = False
    #: A bell token was taken by the wait that preceded this fetch.
    _woken = False
    #: The client ``conn_or_acquire`` hands out (see there).
    _shared_client: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.fetched: set[str] = set()
        #: Tags acknowledged here and not yet in Redis (see ``ReliableQoS.ack``); the fetch in
        #: flight carries ``_acks_in_flight`` of them.
        self.pending_acks: list[str] = []
        self._acks_in_flight = 0
        self._no_ack: set[str] = set()
        self._fetch_layouts: dict[tuple[str, ...], tuple[list[str], list[str], list[str]]] = {}
        self._lists: list[str] = []
        self._depth = 0   #: how deep the fetch in flight reads (see FetchGate)
        super().__init__(*args, **kwargs)
        self.layout = _kombu.RedisLayout(self.unacked_key, self.unacked_index_key, self.sep,
                                         tuple(self.priority_steps), self.global_keyprefix)

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """kombu's, but one client per channel (for its current pool) instead of a new
        ``redis.Redis`` for every publish and ack: building one was a fifth of a publish's time."""
        if client:
            yield client
            return
        pool = self.pool
        if self._shared_client is None or self._shared_client.connection_pool is not pool:
            self._shared_client = self._create_client()
        yield self._shared_client

    def flush_acks(self) -> None:
        """Send the acknowledgements no fetch has carried (one round trip; none when there are none).
        With Redis unreachable they stay held there: the reaper puts them back, and the delivery
        ledger keeps them from running again."""
        carried = self._acks_in_flight if self._in_poll else 0  # no fetch in flight carries any
        tags = self.pending_acks[carried:]
        if not tags:
            return
        try:
            with self.conn_or_acquire() as client:
                client.pipeline().zrem(self.unacked_index_key, *tags).hdel(self.unacked_key, *tags).execute()
        except self.connection_errors:
            log.warning("could not acknowledge %d message(s) in Redis: unreachable; will try again", len(tags))
            return
        del self.pending_acks[carried:carried + len(tags)]

    def close(self) -> None:
        self.flush_acks()
        super().close()

    def create_publish_batch(self, max_size: int) -> BellBatch:
        return BellBatch(self, max_size)

    def _next_delivery_tag(self) -> str:
        return new_id()  # kombu's uuid4 string, made in a third of the time

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        no_ack = kwargs.get("no_ack", args[0] if args else False)
        (self._no_ack.add if no_ack else self._no_ack.discard)(queue)
        self._fetch_layouts.clear()
        return super().basic_consume(queue, *args, **kwargs)

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        """kombu's publish, plus the queue's bell, in the same round trip."""
        batch = kwargs.get("_publish_batch")
        if batch is not None:
            super()._put(queue, message, **kwargs)
            batch.bells[queue] += 1
            return
        if self._expires and queue in self._expires:
            super()._put(queue, message, **kwargs)
            with self.conn_or_acquire() as client:
                ring(client.pipeline(transaction=False), queue).execute()
            return
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        with self.conn_or_acquire() as client:
            ring(client.pipeline(transaction=False).lpush(key, dumps(message)), queue).execute()

    def _do_restore_message(self, payload: dict[str, Any], exchange: str, routing_key: str, pipe: Any,
                            leftmost: bool = False) -> None:
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        for queue in self._lookup(exchange, routing_key):
            ring(pipe, queue)

    def _brpop_start(self, timeout: float | None = None) -> None:
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        if self._waiting:
            self.flush_acks()  # a wait on the bells carries none
            command = ["BRPOP", *(self.layout.bell(queue) for queue in queues), timeout or self.brpop_timeout]
        else:
            command = self._fetch_command(queues)
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()
        try:
            self.client.connection.send_command(*command)
        except BaseException:
            self._in_poll, self._acks_in_flight = None, 0  # not sent: it carries no acks
            raise

    def _fetch_command(self, queues: list[str]) -> list[Any]:
        lists, script_keys, per_list = self._fetch_layout(tuple(queues))
        self._lists = lists
        self._acks_in_flight = len(self.pending_acks)
        gate = self.qos.gate
        self._depth = (gate.depth() or 0) if gate is not None else 0
        return ["EVALSHA", FETCH_SHA, len(script_keys), *script_keys, repr(time.time()),
                "1" if self._woken else "0", _kombu.DEAD_LETTER_CAP, BELL_CAP, gate.queue if gate else "",
                self._depth, *per_list, *self.pending_acks]

    def _fetch_layout(self, queues: tuple[str, ...]) -> tuple[list[str], list[str], list[str]]:
        """The fetch script's lists, keys and per-list arguments for ``queues`` in this order
        (kept: a worker fetches from the same few orders of the same queues every time)."""
        cached = self._fetch_layouts.get(queues)
        if cached is not None:
            return cached
        layout = self.layout
        lists = [(queue, self._q_for_pri(queue, pri)) for pri in self.priority_steps for queue in queues]
        script_keys = [layout._key(self.unacked_key), layout._key(self.unacked_index_key)]
        for queue, name in lists:
            script_keys += [layout._key(name), layout.bell(queue), layout.dead_letters(queue),
                            layout.dead_letter_count(queue)]
        per_list = [arg for queue, _ in lists for arg in ("1" if queue in self._no_ack else "0", queue)]
        self._fetch_layouts[queues] = made = ([name for _, name in lists], script_keys, per_list)
        return made

    def _brpop_read(self, **options: Any) -> bool:
        waited, connection = self._waiting, self.client.connection
        try:
            try:
                reply = self.client.parse_response(connection, "BRPOP" if waited else "EVALSHA", **options)
            except self.connection_errors:
                connection.disconnect()
                raise
            except NoScriptError:  # a new or restarted Redis: load the script, fetch again
                self.client.script_load(FETCH)
                raise Empty() from None
            if not waited:  # the script ran: the acks it carried are in Redis
                del self.pending_acks[:self._acks_in_flight]
        finally:
            self._acks_in_flight = 0
            self._in_poll = None
            self._flush_brpop_reauth()
        if waited:  # a bell rang, or the wait timed out: fetch next either way
            self._waiting, self._woken = False, reply is not None
            raise Empty()
        dead, *taken = reply
        if dead:
            log.warning("moved %d malformed message(s) to the dead letters (sluice dead-letters list)", dead)
        self._woken = False
        if not taken and self._depth:
            self.qos.gate.found_nothing()  # type: ignore[union-attr]  # a depth came from it
            raise Empty()
        if not taken:
            self._waiting = True
            raise Empty()
        number, raw, tag = taken
        self._deliver_fetched(self._lists[int(number) - 1], raw, bytes_to_str(tag))
        return True

    def _deliver_fetched(self, name: str, raw: bytes, tag: str) -> None:
        """Hand a fetched message to its consumer; one that cannot be goes to the dead letters."""
        queue = name.rsplit(self.sep, 1)[0]
        self._queue_cycle.rotate(queue)
        if queue not in self._no_ack:
            self.fetched.add(tag)
        try:
            message = loads(bytes_to_str(raw))
            message["properties"]["delivery_info"][SOURCE_QUEUE] = queue
            if self._depth and queue == self.qos.gate.queue:  # type: ignore[union-attr]  # a depth came from it
                message["properties"]["delivery_info"][FETCH_DEPTH] = self._depth
            self.connection._deliver(message, queue)
        except self.connection_errors:
            raise
        except Exception as exc:
            self.fetched.discard(tag)
            self.qos.forget(tag)
            letter = _kombu.DeadLetter(f"{type(exc).__name__}: {exc}"[:500], queue, time.time(), raw)
            # a plain client: the layout names keys in full, kombu's client would prefix them again
            _kombu.dead_letter(redis.Redis(connection_pool=self.pool), self.layout, letter, held_tag=tag)
            log.warning("moved message %s from %s to the dead letters: %s: %s", tag, queue, type(exc).__name__, exc)

    def forward(self, message: Any, queue: str, headers: dict[str, Any], put_back: int | None = None) -> bool:
        """Move a message this channel holds to ``queue`` with new ``headers``, atomically
        (``forward.lua``), and forget it here; False when it was no longer held (restored).
        Its routing becomes the default exchange and the queue's name, as the reaper's moves.
        ``put_back``: that many messages behind the head of its own queue, uncounted (a packed
        worker without room)."""
        raw, tag = message._raw, message.delivery_tag
        info = {k: v for k, v in raw["properties"]["delivery_info"].items() if k not in (SOURCE_QUEUE, FETCH_DEPTH)}
        source = raw["properties"]["delivery_info"].get(SOURCE_QUEUE) or info.get("routing_key") or "?"
        payload = dict(raw, headers=headers, properties=dict(
            raw["properties"], delivery_info=dict(info, exchange="", routing_key=queue)))
        target = self._q_for_pri(queue, self._get_message_priority(payload, reverse=False))
        layout = self.layout
        client = redis.Redis(connection_pool=self.pool)  # full key names, as in _deliver_fetched
        moved = client.register_script(FORWARD)(
            keys=[layout._key(self.unacked_key), layout._key(self.unacked_index_key), layout._key(target),
                  layout.bell(queue), layout._key(keys.FORWARDED)],
            args=[tag, dumps(payload), BELL_CAP, "" if put_back is not None else f"{source} {queue}", "" if put_back is None else put_back])
        self.fetched.discard(tag)
        self.qos.forget(tag)
        return bool(moved)

    def renew_leases(self) -> None:
        """Move the delivery time of every message this channel holds to now (one round trip)."""
        tags = self.qos.held_tags()
        if tags:
            with self.conn_or_acquire() as client:
                client.zadd(self.unacked_index_key, dict.fromkeys(tags, time.time()), xx=True)


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`ReliableChannel`; renews held messages' leases on a timer."""

    Channel = ReliableChannel

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)
        options = self.client.transport_options or {}
        interval = options.get(LEASE_OPTION) or lease_interval(
            options.get("visibility_timeout", ReliableChannel.visibility_timeout))
        loop.call_repeatedly(interval, self._renew_leases)

    def _renew_leases(self) -> None:
        for channel in list(self.cycle._channels):
            try:
                channel.renew_leases()
            except channel.connection_errors:
                log.debug("lease renewal: broker unreachable, will retry", exc_info=True)


def lease_interval(visibility_timeout: float, orphan_grace: float | None = None) -> float:
    """How often a worker renews its held messages: well inside the visibility timeout and the
    reaper's orphan grace, which both judge a holder by how long ago it renewed."""
    return max(0.25, min(visibility_timeout / 4, (orphan_grace or visibility_timeout) / 4, 30.0))


class SentinelChannel(ReliableChannel, kombu_redis.SentinelChannel):
    """:class:`ReliableChannel` on the master Redis Sentinel names (kombu's Sentinel pool: after
    a failover the next connection goes to the new master)."""


class SentinelTransport(Transport):
    """The sluice transport for ``sentinel://`` broker URLs (transport options ``master_name``,
    ``sentinel_kwargs``; the App sets them from its settings)."""

    Channel = SentinelChannel
    default_port = kombu_redis.SentinelTransport.default_port


def alias_for(url: str) -> str:
    """The transport alias an App names for a broker URL."""
    return SENTINEL_ALIAS if redis_client.is_sentinel(url) else ALIAS


TRANSPORT_ALIASES.setdefault(ALIAS, f"{__name__}:Transport")
TRANSPORT_ALIASES.setdefault(SENTINEL_ALIAS, f"{__name__}:SentinelTransport")
