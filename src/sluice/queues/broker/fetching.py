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
from collections.abc import Callable
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
from redis.connection import ConnectionInterface
from redis.exceptions import NoScriptError

from sluice import keys
from sluice.queues.broker import bells, scripts
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.broker.letters import DEAD_LETTER_CAP
from sluice.queues.broker.moves import FETCH_DEPTH, SOURCE_QUEUE

log = logging.getLogger("sluice.transport")


class Fetching(kombu_redis.Channel):
    """A Redis channel that fetches with ``fetch.lua`` and waits on bells (see the module docstring)."""

    layout: RedisLayout
    pending_acks: list[str]
    _acks_in_flight: int
    flush_acks: Callable[[], None]  #: sends the acks no fetch carried (``qos.AckCarrying``)
    #: Keeps a fetched message that could not be delivered as a dead letter (``forwarding``).
    dead_letter_fetched: Callable[[str, str, bytes, Exception], None]
    #: The next poll command: the fetch script (False) or a wait on the bells (True).
    _waiting = False
    #: A bell token was taken by the wait that preceded this fetch.
    _woken = False
    # kombu's Channel declares these False and None only; they hold the connection a fetch or
    # wait is in flight on (None or False: none) and when it was sent (time.monotonic()).
    _in_poll: ConnectionInterface | bool | None  # type: ignore[assignment]
    _brpop_sent_at: float | None  # type: ignore[assignment]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.fetched: set[str] = set()
        self._no_ack: set[str] = set()
        self._fetch_layouts: dict[tuple[str, ...], tuple[list[str], list[str], list[str]]] = {}
        self._lists: list[str] = []
        self._depth = 0  #: how deep the fetch in flight reads (see qos.FetchGate)
        super().__init__(*args, **kwargs)

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
                bells.ring(client.pipeline(transaction=False), keys.bell(queue)).execute()
            return
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        with self.conn_or_acquire() as client:
            bells.ring(client.pipeline(transaction=False).lpush(key, dumps(message)), keys.bell(queue)).execute()

    def _do_restore_message(
        self, payload: dict[str, Any], exchange: str, routing_key: str, pipe: Any, leftmost: bool = False
    ) -> None:
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        for queue in self._lookup(exchange, routing_key):
            bells.ring(pipe, keys.bell(queue))

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
        return [
            "EVALSHA",
            scripts.sha("fetch"),
            len(script_keys),
            *script_keys,
            repr(time.time()),
            "1" if self._woken else "0",
            DEAD_LETTER_CAP,
            bells.BELL_CAP,
            gate.queue if gate else "",
            self._depth,
            *per_list,
            *self.pending_acks,
        ]

    def _fetch_layout(self, queues: tuple[str, ...]) -> tuple[list[str], list[str], list[str]]:
        """The fetch script's lists, keys and per-list arguments for ``queues`` in this order
        (kept: a worker fetches from the same few orders of the same queues every time)."""
        cached = self._fetch_layouts.get(queues)
        if cached is not None:
            return cached
        layout = self.layout
        lists = [(queue, self._q_for_pri(queue, pri)) for pri in self.priority_steps for queue in queues]
        script_keys = [layout.unacked(), layout.unacked_index()]
        for queue, name in lists:
            script_keys += [
                layout.key(name),
                layout.bell(queue),
                layout.dead_letters(queue),
                layout.dead_letter_count(queue),
            ]
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
        if not taken and self._depth:
            self.qos.gate.found_nothing()  # a depth came from it
            raise Empty()
        if not taken:
            self._waiting = True
            raise Empty()
        number, raw, tag = taken
        self._deliver_fetched(self._lists[int(number) - 1], raw, bytes_to_str(tag))
        return True

    def _deliver_fetched(self, name: str, raw: bytes, tag: str) -> None:
        """Hand a fetched message to its consumer; one that cannot be goes to the dead letters.
        Not on a no-ack queue (a control command's replies, an rpc:// result): its consumer
        took at-most-once, and the error reaches it as on kombu's transport (``inspect()``
        with JSON not accepted raises ContentDisallowed); nothing is left in Redis."""
        queue = name.rsplit(self.sep, 1)[0]
        self._queue_cycle.rotate(queue)
        no_ack = queue in self._no_ack
        if not no_ack:
            self.fetched.add(tag)
        try:
            message = loads(bytes_to_str(raw))
            message["properties"]["delivery_info"][SOURCE_QUEUE] = queue
            if self._depth and queue == self.qos.gate.queue:  # a depth came from it
                message["properties"]["delivery_info"][FETCH_DEPTH] = self._depth
            self.connection._deliver(message, queue)
        except self.connection_errors:
            raise
        except Exception as exc:
            if no_ack:
                raise
            self.dead_letter_fetched(tag, queue, raw, exc)
