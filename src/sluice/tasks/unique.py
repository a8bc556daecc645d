"""Unique tasks: one run per idempotency key.

``task.apply_async(..., idempotency_key="order-42")``, or ``@app.task(unique=Unique(key="order_id",
ttl=3600))`` for a key taken from the call's arguments: the first call with a key claims it in
Redis (``SET NX``, atomic under any number of concurrent callers) for its task id; a call with
the same key while the claim stands publishes nothing and returns the first call's
``AsyncResult`` (the same task id). The claim lasts ``ttl`` seconds from the call, and the
worker renews it when the task starts and when it ends, so it stands while the task waits (up to
``ttl``), runs, and for ``ttl`` after it finished. A publish that fails gives its claim back.
A message from a producer that made no claim (a plain Celery client; with the ``sluice_unique``
header ``"<ttl> <key>"``, or of a task declared unique) claims its key on the worker: a
duplicate is acknowledged without running, and its id resolves to the first call's result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from celery import states

from sluice import entries, keys
from sluice.errors import ConfigurationError
from sluice.tasks.call_keys import CallKey, check_call_key

#: The longest a claim may be kept: a year.
MAX_TTL = 365 * 86_400
#: How long an ``idempotency_key=`` claim lasts (a task declared ``unique=`` has its own ``ttl``).
DEFAULT_TTL = 3600
#: What the key of a unique call is called in errors.
KEY = "idempotency key"


@dataclass(frozen=True)
class Unique:
    """A task's calls are unique by ``key`` (:data:`CallKey`: an argument's value as a string,
    or a callable's) for ``ttl`` seconds (see the module docstring)."""

    key: CallKey
    ttl: int = DEFAULT_TTL

    def __post_init__(self) -> None:
        if isinstance(self.ttl, bool) or not isinstance(self.ttl, int) or not 1 <= self.ttl <= MAX_TTL:
            raise ConfigurationError(f"Unique(ttl={self.ttl!r}) must be a whole number of seconds from 1 to {MAX_TTL}")
        check_call_key(self.key, "Unique")


def claim(client: redis.Redis, task: str, key: str, task_id: str, ttl: int) -> str | None:
    """Claim ``key`` of ``task`` for ``task_id`` for ``ttl`` seconds; the id that holds it already
    (None: this call's claim stands)."""
    held = client.set(keys.unique(task, key), task_id, nx=True, ex=ttl, get=True)
    return None if held is None else held.decode() if isinstance(held, bytes) else str(held)


def give_back(client: redis.Redis, task: str, key: str, task_id: str) -> None:
    """Drop the claim of ``key`` if ``task_id`` still holds it (its publish failed)."""
    name = keys.unique(task, key)
    with client.pipeline() as pipe:
        try:
            pipe.watch(name)
            if pipe.get(name) in (task_id, task_id.encode()):
                pipe.multi()
                pipe.delete(name)
                pipe.execute()
        except redis.WatchError:
            pass


def renew(client: redis.Redis, task: str, key: str, ttl: int) -> None:
    """Keep the claim ``ttl`` seconds from now (the worker, as the task starts and ends)."""
    client.expire(keys.unique(task, key), ttl)


def follow(app: Any, holder: str, duplicate: str, ttl: int) -> None:
    """Make the id of ``duplicate`` (a message a plain producer sent twice) resolve to
    ``holder``'s result: listed as its follower, and given its outcome now if it has one. The
    holder lists its followers after storing its outcome (:func:`resolve_followers`), so one of
    the two always copies it, whichever comes first."""
    name = keys.unique_followers(holder)
    app.redis.pipeline().rpush(name, duplicate).expire(name, ttl).execute()
    meta = app.backend.get_task_meta(holder)
    if meta.get("status") in states.READY_STATES:
        _copy(app, meta, [duplicate])


def resolve_followers(app: Any, holder: str) -> None:
    """Give ``holder``'s stored outcome to the duplicates that follow it (see :func:`follow`)."""
    name = keys.unique_followers(holder)
    followers = entries.decode_each("unique follower", app.redis.lrange(name, 0, -1), entries.text)
    if followers:
        _copy(app, app.backend.get_task_meta(holder), followers)


def _copy(app: Any, meta: dict[str, Any], ids: list[str]) -> None:
    for task_id in ids:
        app.backend.store_result(task_id, meta.get("result"), meta["status"], traceback=meta.get("traceback"))
