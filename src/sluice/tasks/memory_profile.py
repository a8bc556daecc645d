"""Observed memory: each task's peak memory per run, kept in Redis, and the size learned from it.

The worker's watchdog already measures every running task's process tree 20 times a second; when
a run ends it records the run's peak here, in one pipelined round trip: a count in a fixed
log-scale histogram (buckets 2^(1/8) apart from 1Mi, so a quantile is at most 9% high, and never
above the exact peak; at most
``BUCKETS`` fields per task name, whatever the number of runs) and the all-time peak (a sorted set,
``ZADD GT``). A memory kill is an observation of at least the limit it was killed at, and is
counted. Runs shorter than the watchdog's interval are not measured, so not observed.

``Compute(memory="auto")`` routes by :func:`learned_memory`: the app's default memory until a task
has ``min_runs`` observations, then ``p95 * headroom`` rounded up to a tidy size, never below
``floor``. Explicit memory always wins; escalation still catches a learned size that is too small,
and its kill feeds the profile, so the next call starts bigger.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import redis

from sluice import entries, keys
from sluice.compute import Compute

MiB = 1 << 20
#: Buckets per doubling: bucket i holds peaks in (2^((i-1)/8), 2^(i/8)] MiB.
PER_OCTAVE = 8
#: 1Mi to 2^24 Mi (16Ti): more than any machine.
BUCKETS = 24 * PER_OCTAVE + 1
KILLS = "kills"


@dataclass(frozen=True)
class MemoryProfile:
    """A task's observed memory: runs observed, median, 95th percentile and peak, in bytes (0 when none)."""

    count: int
    p50: int
    p95: int
    peak: int
    kills: int = 0


#: No observations yet.
EMPTY = MemoryProfile(0, 0, 0, 0)


def bucket(size: int) -> int:
    return min(BUCKETS - 1, max(0, math.ceil(PER_OCTAVE * math.log2(max(size, 1) / MiB))))


def bucket_top(index: int) -> int:
    """The largest size bucket ``index`` holds (what a quantile reports: never an underestimate)."""
    return math.ceil(MiB * 2 ** (index / PER_OCTAVE))


def observe(pipe: Any, task: str, peak: int, killed: bool = False) -> None:
    """Add one run's peak to a pipeline (the caller executes it)."""
    pipe.hincrby(keys.memory_profile(task), f"b{bucket(peak)}", 1)
    if killed:
        pipe.hincrby(keys.memory_profile(task), KILLS, 1)
    pipe.zadd(keys.MEMORY_PEAKS, {task: peak}, gt=True)


def read(client: redis.Redis, task: str) -> MemoryProfile:
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.memory_profile(task))
    pipe.zscore(keys.MEMORY_PEAKS, task)
    fields, peak = pipe.execute()
    read_fields = dict(entries.decode_each("memory profile field", fields.items(), _field))
    counts = sorted((int(name[1:]), n) for name, n in read_fields.items() if name.startswith("b"))
    total, top = sum(n for _, n in counts), int(peak or 0)
    p50, p95 = (min(_quantile(counts, total, q), top or math.inf) for q in (0.50, 0.95))  # never above the peak seen
    return MemoryProfile(total, int(p50), int(p95), top, read_fields.get(KILLS, 0))


def _field(item: tuple[bytes, bytes]) -> tuple[str, int]:
    """One histogram field (``b<bucket>`` -> runs) or the kill count, as written by :func:`observe`."""
    name, count = item[0].decode(), int(item[1])
    if name != KILLS and not (name.startswith("b") and 0 <= int(name[1:]) < BUCKETS):
        raise ValueError(f"not a field of a memory profile: {name!r}")
    return name, count


def observed_tasks(client: redis.Redis) -> list[str]:
    """Every task name with at least one observation."""
    names = cast("list[bytes | str]", client.zrange(keys.MEMORY_PEAKS, 0, -1))  # no withscores: members only
    return entries.decode_each("observed task name", names, entries.text)


def reset(client: redis.Redis, task: str) -> bool:
    """Forget a task's observations; True when it had any."""
    pipe = client.pipeline()
    pipe.delete(keys.memory_profile(task))
    pipe.zrem(keys.MEMORY_PEAKS, task)
    return any(pipe.execute())


def _quantile(counts: list[tuple[int, int]], total: int, q: float) -> int:
    if not total:
        return 0
    seen = 0
    for index, n in counts:
        seen += n
        if seen >= q * total:
            return bucket_top(index)
    return bucket_top(counts[-1][0])


def tidy(size: int) -> int:
    """Round up to a multiple of a sixteenth of the power of two below (201Mi -> 208Mi, 1.3Gi ->
    1.3125Gi): a round figure that small changes in the p95 seldom move, at most 6.25% more."""
    step = max(MiB, 1 << max(0, size.bit_length() - 5))
    return -(-size // step) * step


def learned_memory(profile: MemoryProfile, min_runs: int, headroom: float, floor: int) -> int | None:
    """The memory a ``memory="auto"`` task runs with; None until it has ``min_runs`` observations."""
    if profile.count < min_runs:
        return None
    return max(floor, tidy(math.ceil(profile.p95 * headroom)))


def with_learned_memory(compute: Compute, profile: MemoryProfile, settings: Any, fallback: int) -> Compute:
    """``compute`` with "auto" memory replaced by the learned size, or ``fallback`` (bytes) until
    there is one; ``settings``: a :class:`sluice.Settings` (its ``auto_*`` values)."""
    if not compute.auto_memory:
        return compute
    learned = learned_memory(profile, settings.auto_min_runs, settings.auto_headroom, settings.auto_floor)
    return compute.replace(memory_bytes=learned or fallback)


class ProfileCache:
    """Profiles as a sender or worker reads them: each task's re-read at most every ``max_age`` s,
    so routing a ``memory="auto"`` task costs a round trip only that often."""

    def __init__(self, client: Callable[[], redis.Redis], max_age: float = 30.0) -> None:
        self._client = client
        self.max_age = max_age
        self._profiles: dict[str, tuple[float, MemoryProfile]] = {}
        self._lock = threading.Lock()

    def get(self, task: str) -> MemoryProfile:
        cached = self._profiles.get(task)
        if cached is not None and time.monotonic() - cached[0] < self.max_age:
            return cached[1]
        with self._lock:
            try:
                profile = read(self._client(), task)
            except redis.RedisError:  # route by what is known (or the default) while Redis is away
                return cached[1] if cached else EMPTY
            self._profiles[task] = (time.monotonic(), profile)
            return profile
