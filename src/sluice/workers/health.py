"""Worker health for probes: ``sluice check --worker NAME`` exits with a named code.

The heartbeat thread refreshes the worker's key every ``heartbeat_interval`` seconds; a key that
is missing, or older than three intervals, means the worker is not doing its job.
"""

from __future__ import annotations

import enum
import time

import redis

from sluice.tasks.heartbeat import read_heartbeat


class Health(enum.IntEnum):
    """Exit codes of ``sluice check`` (0 is healthy; 2 is click's usage error)."""

    OK = 0
    NO_HEARTBEAT = 3  #: the worker never beat, or its key expired (dead, or not started yet)
    STALE_HEARTBEAT = 4  #: the key exists but has not been refreshed for three intervals
    BROKER_DOWN = 5  #: Redis could not be reached to ask


def check_worker(client: redis.Redis, hostname: str, interval: float) -> tuple[Health, str]:
    """The worker's health and a one-line reason."""
    try:
        beat = read_heartbeat(client, hostname)
    except redis.RedisError as exc:
        return Health.BROKER_DOWN, f"cannot reach redis: {exc}"
    if beat is None:
        return Health.NO_HEARTBEAT, f"no heartbeat from {hostname}"
    age = time.time() - beat.ts
    if age > 3 * interval:
        return Health.STALE_HEARTBEAT, f"{hostname}'s last heartbeat is {age:.1f}s old (limit {3 * interval:.1f}s)"
    return Health.OK, f"{hostname} beat {age:.1f}s ago"
