"""Concurrency limits across the cluster: never more than N of a task, or of a task per key,
running at once, on every worker together.

``@app.task(max_running=4)`` limits the task; ``@app.task(max_running=Limit(running=2,
key="customer"))`` limits the calls that share a value of the ``customer`` argument (or of a
callable of the call's ``(args, kwargs)``). A call carries its limits in the ``sluice_limits``
header (``[[id, most], ...]``, made here at publish); the fetch script takes a message only
while each of its limits counts fewer than its most, reading past one that must wait (it stays
in Redis, in its place), and counts it in the same atomic step that holds it (``lua/held.lua``):
the count is always the number of held messages, through worker kills, restores and Redis
restarts. A plain producer's message has no limits header, and no limit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.errors import ConfigurationError
from sluice.tasks.call_keys import CallKey, call_key, check_argument, check_call_key

#: The largest concurrency limit (a larger one is no limit).
MAX_RUNNING = 1_000_000


def _check_running(running: object, what: str) -> int:
    if isinstance(running, bool) or not isinstance(running, int) or not 1 <= running <= MAX_RUNNING:
        raise ConfigurationError(f"{what}={running!r} must be a whole number from 1 to {MAX_RUNNING}")
    return running


@dataclass(frozen=True)
class Limit:
    """At most ``running`` calls at once that share ``key`` (an argument's name, or a callable of
    ``(args, kwargs)``; None: the whole task)."""

    running: int
    key: CallKey | None = None

    def __post_init__(self) -> None:
        _check_running(self.running, "Limit(running)")
        if self.key is not None:
            check_call_key(self.key, "Limit")


def as_limit(max_running: int | Limit) -> Limit:
    """``max_running=`` as a :class:`Limit` (an int: the whole task)."""
    return max_running if isinstance(max_running, Limit) else Limit(_check_running(max_running, "max_running"))


def check_max_running(max_running: object, fun: Callable[..., Any], name: str, bound: bool) -> None:
    """At declaration: an int or a Limit, whose key names an argument of ``fun``."""
    if not isinstance(max_running, (int, Limit)) or isinstance(max_running, bool):
        raise ConfigurationError(f"{name}: max_running={max_running!r} must be a whole number or a sluice.Limit")
    limit = as_limit(max_running)
    if limit.key is not None:
        check_argument(limit.key, fun, name, bound, "Limit")


def limits_header(
    task: str, max_running: int | Limit, run: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> list[list[Any]]:
    """The ``sluice_limits`` header of one call: ``[[id, most]]``, the id naming the task and, for
    a keyed limit, the key's value."""
    limit = as_limit(max_running)
    if limit.key is None:
        return [[task, limit.running]]
    name = limit.key if isinstance(limit.key, str) else "key"
    return [[f"{task}:{name}={call_key(limit.key, run, args, kwargs, 'limit key')}", limit.running]]
