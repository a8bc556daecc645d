"""The one place that knows how kombu's Redis transport lays out a broker, and Celery its results.

kombu keeps a queue as a Redis list (plus one list per priority step, named queue + sep + step),
every delivered-but-unacknowledged message in the ``unacked`` hash (tag -> [message, exchange,
routing key]) with its delivery time in the ``unacked_index`` sorted set, and the queues bound to
an exchange in a set ``_kombu.binding.<exchange>`` (members exchange-key + sep + queue). Names
and separator follow the broker's transport options, defaulting to kombu's own. Celery's result
keys come from the result backend itself.

sluice's own transport (``sluice.queues.broker.transport``) is built on this layout, and adds two key kinds
to it: a bell per queue (``bells``) and a dead-letter list per queue (``letters``).
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import redis
from celery.backends.base import BaseKeyValueStoreBackend
from celery.utils.nodenames import worker_direct
from kombu import Queue
from kombu.exceptions import DecodeError
from kombu.transport.redis import PRIORITY_STEPS, Channel

from sluice import entries, keys
from sluice.compute import Compute
from sluice.queues.broker import scripts
from sluice.tenants import DEFAULT_TENANT, split_queue, tenant_queue


@dataclass(frozen=True)
class Held:
    """A message a worker holds unacknowledged: its delivery tag, the message, the queue it came from."""

    tag: str
    message: dict[str, Any]
    queue: str

    @property
    def task_id(self) -> str | None:
        return (self.message.get("headers") or {}).get("id")

    @classmethod
    def decode(cls, tag: bytes, entry: bytes) -> Held:
        """One field of the unacked hash: ``[message, exchange, routing key]`` as JSON, the routing
        key being the queue the message came from."""
        message, _exchange, queue = entries.loads(entry)
        if not isinstance(queue, str):
            raise TypeError(f"the queue of a held message is {type(queue).__name__}, not a string")
        return cls(tag.decode(), envelope(message), queue)


def envelope(message: Any) -> dict[str, Any]:
    """``message`` if it has the shape sluice reads of a kombu message (an object, whose
    ``headers`` are an object if there are any); else TypeError."""
    if not isinstance(message, dict) or not isinstance(message.get("headers") or {}, dict):
        raise TypeError("not a kombu message: an object with an object of headers")
    return message


def message_of(raw: bytes | str) -> dict[str, Any]:
    """A message as it waits on a queue (JSON bytes), decoded."""
    return envelope(entries.loads(raw))


@dataclass(frozen=True)
class RedisLayout:
    """kombu's key names and separator for one broker (see the module docstring)."""

    unacked_key: str = Channel.unacked_key
    unacked_index_key: str = Channel.unacked_index_key
    sep: str = Channel.sep
    priority_steps: tuple[int, ...] = tuple(PRIORITY_STEPS)
    global_keyprefix: str = ""

    @classmethod
    def of(cls, transport_options: dict[str, Any] | None) -> RedisLayout:
        """The layout a broker with these ``broker_transport_options`` uses."""
        options = transport_options or {}
        base = cls()
        return cls(
            unacked_key=options.get("unacked_key", base.unacked_key),
            unacked_index_key=options.get("unacked_index_key", base.unacked_index_key),
            sep=options.get("sep", base.sep),
            priority_steps=tuple(options.get("priority_steps", base.priority_steps)),
            global_keyprefix=options.get("global_keyprefix", base.global_keyprefix),
        )

    @classmethod
    def of_app(cls, app: Any) -> RedisLayout:
        return cls.of(app.conf.broker_transport_options)

    def key(self, name: str) -> str:
        """The full name of key ``name`` (kombu's own client adds the prefix; a plain one does not)."""
        return self.global_keyprefix + name

    def unacked(self) -> str:
        """The full name of kombu's unacked hash (tag -> [message, exchange, routing key])."""
        return self.key(self.unacked_key)

    def unacked_index(self) -> str:
        """The full name of kombu's unacked index (tag -> delivery time)."""
        return self.key(self.unacked_index_key)

    def bell(self, queue: str) -> str:
        return self.key(keys.bell(queue))

    def tenant_lines(self, queue: str) -> str:
        return self.key(keys.tenant_lines(queue))

    def held_charges(self) -> str:
        return self.key(keys.HELD_CHARGES)

    def tenant_usage(self) -> str:
        return self.key(keys.TENANT_USAGE)

    def revoked(self) -> str:
        return self.key(keys.REVOKED)

    def limit_rates(self) -> str:
        return self.key(keys.LIMIT_RATES)

    def task_limits(self) -> str:
        return self.key(keys.TASK_LIMITS)

    def limit_next_prefix(self) -> str:
        return self.key(keys.LIMIT_NEXT_PREFIX)

    def unhold_keys(self) -> list[str]:
        """The keys a script that lets held messages go names first (``lua/held.lua``'s ``unhold``)."""
        return [
            self.unacked(),
            self.unacked_index(),
            self.held_charges(),
            self.tenant_usage(),
            self.key(keys.HELD_LIMITS),
            self.key(keys.LIMIT_RUNNING),
        ]

    def dead_letters(self, queue: str) -> str:
        return self.key(keys.dead_letters(queue))

    def dead_letter_count(self, queue: str) -> str:
        return self.key(keys.stat("dead_letters", queue))

    def queue_lists(self, queue: str) -> list[str]:
        """The Redis lists holding one queue's waiting messages, one per priority step."""
        return [self.key(f"{queue}{self.sep}{step}" if step else queue) for step in self.priority_steps]

    def tenant_queues(self, client: redis.Redis, queue: str) -> dict[str, str]:
        """Tenant -> the queue its messages for ``queue`` wait on: the queue's own (the default
        tenant) and each tenant's listed in its tenant set (``sluice.tenants``)."""
        listed = entries.decode_each("tenant", client.smembers(self.tenant_lines(queue)), entries.text)
        return {DEFAULT_TENANT: queue, **{tenant: tenant_queue(queue, tenant) for tenant in sorted(listed)}}

    def parked(self, queue: str) -> str:
        return self.key(keys.parked(queue))

    def parked_count(self, queue: str) -> str:
        return self.key(keys.parked_count(queue))

    def parked_lists(self, client: redis.Redis, queue: str) -> dict[str, list[str]]:
        """Tenant -> the lists of ``queue``'s messages its calls have parked on rate limits."""
        index = self.parked(queue)
        found: dict[str, list[str]] = {}
        members = cast("list[bytes]", client.zrange(index, 0, -1))
        for member in entries.decode_each("parked line", members, entries.text):
            found.setdefault(member.split("\t", 1)[0], []).append(f"{index}\t{member}")
        return found

    def tenant_depths(self, client: redis.Redis, queue: str) -> dict[str, int]:
        """Messages waiting in ``queue`` per tenant (every priority list of each, and those parked
        on a rate limit), in three round trips."""
        queues = self.tenant_queues(client, queue)
        parked = self.parked_lists(client, queue)
        lists = {
            tenant: [*(self.queue_lists(queues[tenant]) if tenant in queues else []), *parked.get(tenant, [])]
            for tenant in {**queues, **parked}
        }
        pipe = client.pipeline(transaction=False)
        for keys_of_tenant in lists.values():
            for key in keys_of_tenant:
                pipe.llen(key)
        lengths, at, depths = pipe.execute(), 0, {}
        for tenant, keys_of_tenant in lists.items():
            depths[tenant], at = sum(lengths[at : at + len(keys_of_tenant)]), at + len(keys_of_tenant)
        return depths

    def queue_depth(self, client: redis.Redis, queue: str) -> int:
        """Messages waiting in a queue (every tenant's, every priority list of it)."""
        return sum(self.tenant_depths(client, queue).values())

    def waiting(self, client: redis.Redis, queue: str, sample: int | None = None) -> list[dict[str, Any]]:
        """Every message waiting in a queue (every tenant's, every priority list of it, and those
        parked on a rate limit; with ``sample``, the first that many of each list); one that does
        not decode is skipped."""
        end = -1 if sample is None else sample - 1
        lists = [key for name in self.tenant_queues(client, queue).values() for key in self.queue_lists(name)]
        lists += [key for parked in self.parked_lists(client, queue).values() for key in parked]
        raws = [raw for name in lists for raw in client.lrange(name, 0, end)]
        return entries.decode_each("waiting message", raws, message_of)

    def waiting_task_ids(self, client: redis.Redis, queue: str) -> set[str | None]:
        """The task ids of every message waiting in a queue."""
        return {(message.get("headers") or {}).get("id") for message in self.waiting(client, queue)}

    def held_entries(self, client: redis.Redis) -> tuple[list[Held], list[tuple[tuple[bytes, bytes], Exception]]]:
        """Every message delivered to a worker and not acknowledged yet, and apart the (tag, entry)
        pairs that do not decode (with why): a worker may hold a message sluice cannot read."""
        held = cast("dict[bytes, bytes]", client.hgetall(self.unacked()))  # sluice's clients never decode responses
        return entries.split("held message", held.items(), lambda item: Held.decode(*item))

    def held(self, client: redis.Redis) -> list[Held]:
        """Every message delivered to a worker and not acknowledged yet (one that does not decode is skipped)."""
        return self.held_entries(client)[0]

    def held_by_queue(self, client: redis.Redis) -> Counter[str]:
        """How many messages workers hold, per queue they came from (a tenant's queue counting for its class)."""
        return Counter(split_queue(item.queue)[0] for item in self.held(client))

    def tenant_usage_of(self, client: redis.Redis) -> dict[tuple[str, str], Compute]:
        """``(class queue, tenant)`` -> what the tenant's held messages charge there now
        (``lua/held.lua``; an axis nothing is charged on is unset)."""
        axes: dict[tuple[str, str], dict[str, int]] = {}
        for field, value in entries.decode_each(
            "tenant usage", client.hgetall(self.tenant_usage()).items(), _usage_entry
        ):
            queue, tenant, axis = field
            axes.setdefault((queue, tenant), {})[axis] = value
        return {
            where: Compute.of(use.get("cpu") or None, use.get("memory") or None, use.get("gpu") or None)
            for where, use in axes.items()
        }

    def held_since(self, client: redis.Redis, tag: str | bytes) -> float | None:
        """When a held message was delivered (kombu's index), if it is still held."""
        return client.zscore(self.unacked_index(), tag)

    def drop_held(self, client: redis.Redis, queue: str) -> int:
        """Forget the held messages that came from ``queue`` (its workers are gone for good)."""
        tags = [item.tag for item in self.held(client) if item.queue == queue]
        if tags:
            scripts.run(client, "ack", self.unhold_keys(), tags)
        return len(tags)

    def bound_queues(self, client: redis.Redis, exchange: str) -> list[str]:
        """The queues bound to an exchange (for Celery's direct exchange: every worker's own queue)."""
        members = client.smembers(self.key(Channel.keyprefix_queue % exchange))
        return entries.decode_each(
            "queue binding", members, lambda member: entries.text(member).rsplit(self.sep, 1)[-1]
        )


def _usage_entry(item: tuple[bytes | str, bytes | str]) -> tuple[tuple[str, str, str], int]:
    """One field of the tenants' usage hash: ``<queue>\t<tenant>\t<axis>`` -> a whole number."""
    queue, tenant, axis = entries.text(item[0]).split("\t")
    return (queue, tenant, axis), int(item[1])


#: A kombu queue (what Celery routes a message to when a name is not enough).
WorkerQueue = Queue


def worker_queue(worker: str) -> WorkerQueue:
    """A worker's own queue (Celery's worker-direct queue, ``<worker>.dq2``), bound as Celery binds it."""
    return worker_direct(worker)


def task_args(message: dict[str, Any]) -> list[Any] | None:
    """The positional arguments of a Celery (protocol 2) task message; None if it is not one."""
    try:
        body = message["body"]
        if (message.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        payload = json.loads(body)
    except (KeyError, TypeError, ValueError):
        return None
    return payload[0] if isinstance(payload, list) and payload and isinstance(payload[0], list) else None


def restore(app: Any, tag: str) -> None:
    """Put a held message back on its queue with kombu's own restore (priorities, redelivered
    flag), on a short-lived channel."""
    with app.connection_for_write() as connection:
        connection.default_channel.qos.restore_by_tag(tag)


def task_meta_key(app: Any, task_id: str) -> bytes:
    """The Redis key of a task's result, as the app's result backend names it."""
    return bytes(app.backend.get_key_for_task(task_id))


def task_states(app: Any, task_ids: list[str]) -> list[str | None]:
    """Each task's stored state (None: nothing stored yet, or nothing readable), read from the
    app's result backend: in one round trip where results are a key-value store (Redis, in the
    broker's database or another), else one read each (a database, ``rpc://``)."""
    backend = app.backend
    if not isinstance(backend, BaseKeyValueStoreBackend):

        def state(task_id: str) -> str:
            with _decode_errors_as_value_errors():
                return str(backend.get_state(task_id))

        return [entries.decode_one("task result", task_id, state, None) for task_id in task_ids]
    metas = backend.mget([task_meta_key(app, task_id) for task_id in task_ids])

    def status(raw: bytes | str) -> str:
        return str(result_meta(backend.decode, raw)["status"])

    return [None if raw is None else entries.decode_one("task result", raw, status, None) for raw in metas]


def result_meta(decode: Callable[[bytes | str], Any], raw: bytes | str) -> dict[str, Any]:
    """A stored result's meta, as ``decode`` (one of the result backend's) reads it; ValueError
    when it does not decode (kombu raises its own DecodeError), so readers of many skip it."""
    with _decode_errors_as_value_errors():
        meta = decode(raw)
    if not isinstance(meta, dict):
        raise TypeError(f"a stored result is a JSON object, not {type(meta).__name__}")
    return meta


@contextlib.contextmanager
def _decode_errors_as_value_errors() -> Iterator[None]:
    """kombu's DecodeError as the ValueError that readers of many entries skip an entry for."""
    try:
        yield
    except DecodeError as exc:
        raise ValueError(exc) from exc
