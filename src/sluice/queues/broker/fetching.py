"""Fetch and bells: how the sluice channel takes a message, and rings a queue's bell.

kombu's BRPOP removes a message from Redis before the worker records it as unacknowledged, so a
worker killed in between loses it for good. Here a worker takes a message with ``fetch.lua``,
which moves it into kombu's unacked hash in the same atomic step (carrying the acks made since
the last fetch, see ``qos``); from then on the orphan reaper and kombu's own restore can always
give it back. A Lua script cannot block, so an idle worker blocks on its queues' bells
(``bells``) and then fetches; a message from a producer that does not ring (a plain Celery
client) is found by the next fetch, at most ``brpop_timeout`` (1 s) later. A message whose
envelope is not kombu's is moved to its queue's dead letters by the script.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
from redis.connection import ConnectionInterface
from redis.exceptions import NoScriptError

from sluice.headers import CHARGE, LIMITS, SENT, TENANT
from sluice.queues.broker import bells, scripts
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.broker.letters import DEAD_LETTER_CAP
from sluice.queues.broker.moves import FETCH_DEPTH, REVOKED, SOURCE_QUEUE
from sluice.tenants import DEFAULT_TENANT, TENANT_SEPARATOR

log = logging.getLogger("sluice.transport")
#: The transport option a sluice App sets to what the fetch script needs of each resource class:
#: ``{queue: (one slot's charge, the tenants' shares)}`` (``ResourceClass.fetch_terms``).
SHARES_OPTION = "sluice_shares"
#: The transport option with the longest a message waits behind higher priorities of its
#: tenant before it goes first (seconds; the ``priority_max_wait`` setting).
PRIORITY_WAIT_OPTION = "sluice_priority_max_wait"


@dataclass(frozen=True)
class FetchCall:
    """The keys and arguments of ``fetch.lua`` for some queues, in the order to try them (see
    the script's header, the one description of them); the acks and the moment vary per call."""

    keys: tuple[str, ...]
    fixed: tuple[Any, ...]  #: the arguments after the first six, up to the acks
    queues: tuple[str, ...]

    @classmethod
    def of(
        cls,
        layout: RedisLayout,
        queues: Iterable[tuple[str, bool, tuple[str, str] | None]],
        priority_wait: float = 0,
    ) -> FetchCall:
        """``queues``: each queue's name, whether its consumer takes no acks, and for a resource
        class what the fetch needs of it (``ResourceClass.fetch_terms``; None for another queue);
        ``priority_wait``: the longest a message waits behind higher priorities (0: no bound)."""
        listed = list(queues)
        script_keys = [*layout.unhold_keys(), layout.revoked(), layout.limit_rates(), layout.task_limits()]
        per_queue: list[Any] = []
        for queue, no_ack, terms in listed:
            script_keys += [
                layout.bell(queue),
                layout.dead_letters(queue),
                layout.dead_letter_count(queue),
                layout.tenant_lines(queue),
                layout.parked(queue),
                layout.parked_count(queue),
            ]
            slot, shares = terms or ("", "")
            per_queue += ["1" if no_ack else "0", queue, slot, shares]
        fixed = (
            layout.global_keyprefix,
            layout.sep,
            ",".join(str(step) for step in layout.priority_steps),
            TENANT_SEPARATOR,
            DEFAULT_TENANT,
            TENANT,
            CHARGE,
            SENT,
            priority_wait,
            LIMITS,
            layout.limit_next_prefix(),
            len(listed),
            *per_queue,
        )
        return cls(tuple(script_keys), fixed, tuple(queue for queue, _, _ in listed))

    def arguments(
        self, now: float, woken: bool, deep_queue: str, depth: int, acks: Iterable[str] = ()
    ) -> tuple[tuple[str, ...], list[Any]]:
        """The keys and arguments of one fetch."""
        head = [repr(now), "1" if woken else "0", DEAD_LETTER_CAP, bells.BELL_CAP, deep_queue, depth]
        return self.keys, [*head, *self.fixed, *acks]


class Fetching(kombu_redis.Channel):
    """A Redis channel that fetches with ``fetch.lua`` and waits on bells (see the module docstring)."""

    layout: RedisLayout
    pending_acks: list[str]
    _acks_in_flight: int
    flush_acks: Callable[[], None]  #: sends the acks no fetch carried (``qos.AckCarrying``)
    #: Keeps a fetched message that could not be delivered as a dead letter (``forwarding``).
    dead_letter_fetched: Callable[[str, str, bytes, Exception], None]
    _plain_client: Callable[[], Any]  #: a client naming keys in full (``forwarding``)
    #: The next poll command: the fetch script (False) or a wait on the bells (True).
    _waiting = False
    #: A bell token was taken by the wait that preceded this fetch.
    _woken = False
    #: No fetch until a timer on the event loop ends the wait: a message waits for a rate
    #: limit's next start, sooner than a wait on the bells could end (see ``_wait``).
    _deferred = False
    # kombu's Channel declares these False and None only; they hold the connection a fetch or
    # wait is in flight on (None or False: none) and when it was sent (time.monotonic()).
    _in_poll: ConnectionInterface | bool | None  # type: ignore[assignment]
    _brpop_sent_at: float | None  # type: ignore[assignment]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.fetched: set[str] = set()
        self._no_ack: set[str] = set()
        self._fetch_calls: dict[tuple[str, ...], FetchCall] = {}
        self._fetching: tuple[str, ...] = ()  #: the queues of the fetch in flight, in its order
        self._depth = 0  #: how deep the fetch in flight reads (see qos.FetchGate)
        super().__init__(*args, **kwargs)

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        no_ack = kwargs.get("no_ack", args[0] if args else False)
        (self._no_ack.add if no_ack else self._no_ack.discard)(queue)
        self._fetch_calls.clear()
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
                bells.announce(client.pipeline(transaction=False), queue).execute()
            return
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        with self.conn_or_acquire() as client:
            bells.announce(client.pipeline(transaction=False).lpush(key, dumps(message)), queue).execute()

    def _size(self, queue: str) -> int:
        """kombu's size of a queue, counting each tenant's queue of it (``sluice.tenants``) and its
        messages parked on rate limits too."""
        size = super()._size  # bound here: a generator has no zero-argument super()
        parked = int(self._plain_client().llen(self.layout.parked_count(queue)))
        return parked + sum(size(name) for name in self._and_tenants(queue))

    def _purge(self, queue: str) -> int:
        """kombu's purge of a queue (``celery purge``), each tenant's queue of it and its parked
        messages included."""
        purge = super()._purge
        client = self._plain_client()
        parked = [key for lists in self.layout.parked_lists(client, queue).values() for key in lists]
        pipe = client.pipeline()
        for key in parked:
            pipe.llen(key)
        pipe.delete(*parked, self.layout.parked(queue), self.layout.parked_count(queue))
        gone = sum(pipe.execute()[:-1])
        return gone + sum(purge(name) for name in self._and_tenants(queue))

    def _and_tenants(self, queue: str) -> list[str]:
        return list(self.layout.tenant_queues(self._plain_client(), queue).values())

    def _do_restore_message(
        self, payload: dict[str, Any], exchange: str, routing_key: str, pipe: Any, leftmost: bool = False
    ) -> None:
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        for queue in self._lookup(exchange, routing_key):
            bells.announce(pipe, queue)

    def _brpop_start(self, timeout: float | None = None) -> None:
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        if self._deferred:
            if self.pending_acks:
                self.flush_acks()  # no fetch carries them before the timer
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
        call = self._fetch_call(tuple(queues))
        self._fetching = call.queues
        self._acks_in_flight = len(self.pending_acks)
        gate = self.qos.gate
        self._depth = (gate.depth() or 0) if gate is not None else 0
        script_keys, args = call.arguments(
            time.time(), self._woken, gate.queue if gate else "", self._depth, self.pending_acks
        )
        return ["EVALSHA", scripts.sha("fetch"), len(script_keys), *script_keys, *args]

    def _fetch_call(self, queues: tuple[str, ...]) -> FetchCall:
        """The fetch script's call for ``queues`` in this order (kept: a worker fetches from the
        same few orders of the same queues every time)."""
        cached = self._fetch_calls.get(queues)
        if cached is None:
            options = self.connection.client.transport_options or {}
            terms = options.get(SHARES_OPTION) or {}
            cached = self._fetch_calls[queues] = FetchCall.of(
                self.layout,
                [(queue, queue in self._no_ack, terms.get(queue)) for queue in queues],
                options.get(PRIORITY_WAIT_OPTION) or 0,
            )
        return cached

    def _brpop_read(self, **options: Any) -> bool:
        waited, connection, sent_at = self._waiting, self.client.connection, self._brpop_sent_at
        try:
            try:
                reply = self.client.parse_response(connection, "BRPOP" if waited else "EVALSHA", **options)
            except self.connection_errors:
                connection.disconnect()
                raise
            except NoScriptError:  # a new or restarted Redis: load the script, fetch again
                scripts.load(self.client, "fetch")
                raise Empty() from None
            if not waited:  # the script ran: the acks it carried are in Redis
                del self.pending_acks[: self._acks_in_flight]
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
        if len(taken) <= 1 and self._depth:
            self.qos.gate.found_nothing()  # a depth came from it
            raise Empty()
        if len(taken) <= 1:  # nothing to take; maybe a message waiting for a rate limit
            self._wait(int(taken[0]) / 1e6 if taken else None, sent_at or time.monotonic())
            raise Empty()
        number, raw, tag, revoked = taken
        self._deliver_fetched(self._fetching[int(number) - 1], raw, bytes_to_str(tag), bool(revoked))
        return True

    def _wait(self, rate_wait: float | None, sent_at: float) -> None:
        """After a fetch that took nothing: wait on the bells (a publish rings one; the wait ends
        after ``brpop_timeout`` anyway), or, when a message waits for a rate limit's next start
        sooner than that, fetch again at that moment: Redis ends a blocking wait only on its
        tenth-of-a-second clock, and a worker asking again and again would spin. The moment is
        counted from when the fetch was sent (``sent_at``, monotonic): the script ran about half
        a round trip later, so the next fetch, sent then, reaches Redis about when it may start
        one, and the rate is not lost to the reply's way back."""
        loop = getattr(self.connection, "event_loop", None)
        if rate_wait is None or loop is None or rate_wait >= self.brpop_timeout:
            self._waiting = True
            return
        delay = sent_at + rate_wait - time.monotonic()
        if delay > 0:
            self._deferred = True
            loop.call_later(delay, self._end_deferral)

    def _end_deferral(self) -> None:
        self._deferred = False

    def _deliver_fetched(self, queue: str, raw: bytes, tag: str, revoked: bool = False) -> None:
        """Hand a fetched message to its consumer; one that cannot be goes to the dead letters.
        Not on a no-ack queue (a control command's replies, an rpc:// result): its consumer
        took at-most-once, and the error reaches it as on kombu's transport (``inspect()``
        with JSON not accepted raises ContentDisallowed); nothing is left in Redis."""
        self._queue_cycle.rotate(queue)
        no_ack = queue in self._no_ack
        if not no_ack:
            self.fetched.add(tag)
        try:
            message = loads(bytes_to_str(raw))
            message["properties"]["delivery_info"][SOURCE_QUEUE] = queue
            if self._depth and queue == self.qos.gate.queue:  # a depth came from it
                message["properties"]["delivery_info"][FETCH_DEPTH] = self._depth
            if revoked:  # its task is recorded as revoked: the worker ends it REVOKED (sluice.queues.revokes)
                message["properties"]["delivery_info"][REVOKED] = True
            self.connection._deliver(message, queue)
        except self.connection_errors:
            raise
        except Exception as exc:
            if no_ack:
                raise
            self.dead_letter_fetched(tag, queue, raw, exc)
