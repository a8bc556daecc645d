"""Rate and concurrency limits across the cluster: never more than N of a task, or of a task
per key, started per second (minute, hour), or running at once, on every worker together.

``@app.task(rate_limit="50/s")`` (Celery's option and syntax) spaces the task's starts evenly
over the whole cluster, never more than 50 in a second plus :data:`START_JITTER`;
``@app.task(max_running=4)`` limits how many run at once. Either
takes a :class:`Limit` with a ``key`` (an argument's name, or a callable of the call's ``(args,
kwargs)``): ``rate_limit=Limit("10/s", key="customer")``, ``max_running=Limit(running=2,
key="customer")`` limit the calls that share the key's value. A call carries its limits in the
``sluice_limits`` header (``[[id, most running, seconds between starts], ...]``, made here at
publish). The fetch script takes a message only while each of its limits has room, reading past
one that waits for a concurrency limit (it stays in its place) and parking one that waits for a
rate limit (out of the line until its next start), and spends the room in the same atomic step
that holds it (``lua/held.lua``): a running count is always the number of held messages,
through worker kills, restores and Redis restarts, and a rate limit's next start is a key that
expires when it may happen (Redis's clock, one for every worker). A worker with nothing else to
take waits for that moment instead of asking again. A plain producer's message has no limits
header, and no limit; the ``rate_limit_per_worker`` setting gives ``rate_limit`` back its Celery
meaning (each worker process keeps the rate for itself, holding messages in its memory).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from celery.utils.time import rate as per_second

from sluice.errors import ConfigurationError
from sluice.tasks.call_keys import CallKey, call_key, check_argument, check_call_key

#: The largest concurrency limit (a larger one is no limit).
MAX_RUNNING = 1_000_000
#: The task options that take a :class:`Limit` (``rate_limit`` is Celery's own).
RATE_OPTION, RUNNING_OPTION = "rate_limit", "max_running"
#: Where a task keeps ``rate_limit=Limit(...)``: Celery's ``rate_limit`` attribute is read as a
#: rate by Celery's own code (a plain Celery app's worker, ``celery control``).
KEYED_RATE_OPTION = "keyed_rate_limit"


def _check_running(running: object, what: str) -> int:
    if isinstance(running, bool) or not isinstance(running, int) or not 1 <= running <= MAX_RUNNING:
        raise ConfigurationError(f"{what}={running!r} must be a whole number from 1 to {MAX_RUNNING}")
    return running


#: A rate as Celery writes one: "50/s", "10/m", "100/h", or a number (per second).
Rate = str | int | float


#: What a rate limit allows for the time between a worker taking a call and its body starting
#: (seconds): N calls per period are held to N per period plus this, so they start no more than
#: N in any period even when some start a few milliseconds later than they were taken.
START_JITTER = 0.04
#: Celery's rate units, in seconds.
PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def rate_window(rate: Rate, what: str) -> tuple[int, float]:
    """``rate`` as N calls per period (seconds): "50/s" (50, 1), "10/m" (10, 60), "2.5/s" (2, 0.8),
    "0.5/s" (1, 2); a bad rate is an error naming it (see :func:`parse_rate`)."""
    per_second = parse_rate(rate, what)
    count, _, unit = str(rate).partition("/")
    calls = float(count) if unit else per_second
    whole = max(1, int(calls))
    return whole, round(whole / per_second, 9)


def parse_rate(rate: object, what: str) -> float:
    """``rate`` in calls per second; a malformed, zero or negative one is an error naming it."""
    try:
        value = per_second(rate) if isinstance(rate, (str, int, float)) and not isinstance(rate, bool) else 0.0
    except (ValueError, KeyError):
        value = 0.0
    if not value > 0:
        raise ConfigurationError(
            f'{what}={rate!r} must be a positive rate: "50/s", "10/m", "100/h" or a number (per second)'
        )
    return float(value)


@dataclass(frozen=True)
class Limit:
    """A limit on the calls that share ``key`` (an argument's name, or a callable of ``(args,
    kwargs)``; None: the whole task): ``rate`` starts per second, minute or hour (for
    ``rate_limit=``), or ``running`` at once (for ``max_running=``)."""

    rate: Rate | None = None
    running: int | None = None
    key: CallKey | None = None

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.running is None):
            raise ConfigurationError(
                f"Limit(rate={self.rate!r}, running={self.running!r}) needs exactly one of them: "
                'Limit("10/s", key=...) for rate_limit=, Limit(running=2, key=...) for max_running='
            )
        if self.rate is not None:
            parse_rate(self.rate, "Limit(rate)")
        if self.running is not None:
            _check_running(self.running, "Limit(running)")
        if self.key is not None:
            check_call_key(self.key, "Limit")


def as_limit(value: object, option: str) -> Limit:
    """``max_running=`` or ``rate_limit=`` as a :class:`Limit` (a number or a rate string: the
    whole task); one that is neither, or a Limit of the other kind, is an error naming it."""
    if isinstance(value, Limit):
        if (value.rate is None) == (option == RATE_OPTION):
            raise ConfigurationError(
                f'{option}={value!r} is a limit of the other kind: rate_limit=Limit("10/s", ...), '
                "max_running=Limit(running=2, ...)"
            )
        return value
    if option == RATE_OPTION:
        parse_rate(value, option)
        return Limit(rate=value)  # type: ignore[arg-type]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigurationError(f"max_running={value!r} must be a whole number or a sluice.Limit")
    return Limit(running=_check_running(value, "max_running"))


def check_limit(option: str, value: object, fun: Callable[..., Any], name: str, bound: bool) -> None:
    """At declaration: ``value`` is usable for ``option``, and a key of it names an argument of ``fun``."""
    try:
        limit = as_limit(value, option)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{name}: {exc}") from None
    if limit.key is not None:
        check_argument(limit.key, fun, name, bound, "Limit")


def limits_header(
    task: str, limits: Mapping[str, object], run: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> list[list[Any]]:
    """The ``sluice_limits`` header of one call, for each of ``limits`` (option -> value, as the
    task declares them): ``[id, most running, 0]`` or ``[id, 0, seconds between starts, N,
    window]`` (at most N starts in any window of that many seconds: the period plus
    :data:`START_JITTER`), the id naming the task and, for a keyed limit, the key's value."""
    header = []
    for option, value in limits.items():
        limit = as_limit(value, option)
        name = task
        if limit.key is not None:
            key = call_key(limit.key, run, args, kwargs, "limit key")
            name = f"{task}:{limit.key if isinstance(limit.key, str) else 'key'}={key}"
        if limit.rate is not None:
            calls, period = rate_window(limit.rate, option)
            window = period + START_JITTER
            header.append([name, 0, window / calls, calls, window])
        else:
            header.append([name, limit.running, 0])
    return header


def task_wide_header(task: Any) -> list[list[Any]]:
    """The limits a call of ``task`` whose message carries none (a plain Celery producer's) is
    held to: its limits with any key left out, all such calls sharing one count or rate."""
    held = getattr(task, "cluster_limits", {})
    wide = {option: replace(as_limit(value, option), key=None) for option, value in held.items()}
    return limits_header(task.name, wide, task.run, (), {}) if wide else []


def describe(task: Any) -> str:
    """A task's limits in words, for ``sluice explain``: "20/s; 2 running per customer"; a rate
    left to Celery (``rate_limit_per_worker``) says so; "" when it has none."""
    held = getattr(task, "cluster_limits", {})
    words = []
    for option, value in held.items():
        limit = as_limit(value, option)
        what = str(limit.rate) if limit.rate is not None else f"{limit.running} running"
        if limit.key is not None:
            what += f" per {limit.key if isinstance(limit.key, str) else 'key'}"
        words.append(what)
    rate = getattr(task, RATE_OPTION, None)
    if rate is not None and RATE_OPTION not in held:
        words.append(f"{rate} per worker process")
    return "; ".join(words)
