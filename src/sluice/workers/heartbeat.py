"""Worker heartbeat: a Redis key per worker, refreshed every few seconds, gone when it dies.

``sluice status`` and the autoscaler read these keys: which workers are online, which classes
they serve, how many slots they have and what they are running right now.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import redis

from sluice import keys
from sluice.workers.periodic import Periodic


class Heartbeat(Periodic):
    """Writes ``payload()`` to the worker's heartbeat key every ``interval`` seconds.

    The key lives ``TTL_BEATS`` intervals, so a worker is taken for dead after missing that many.
    """

    TTL_BEATS = 5
    tick_first = True

    def __init__(self, client: redis.Redis, hostname: str, payload: Callable[[], dict[str, Any]],
                 interval: float = 2.0) -> None:
        super().__init__("sluice-heartbeat", interval)
        self.client = client
        self.key = keys.worker_heartbeat(hostname)
        self.payload = payload

    def tick(self) -> None:
        body = self.payload() | {"ts": time.time()}
        self.client.set(self.key, json.dumps(body), px=int(self.interval * self.TTL_BEATS * 1000))

    def stop(self) -> None:
        """Stop beating and remove the key, so the worker is offline at once, not after the TTL."""
        super().stop()
        try:
            self.client.delete(self.key)
        except redis.RedisError:
            pass


def read_heartbeats(client: redis.Redis) -> list[dict[str, Any]]:
    """Every live worker's last heartbeat."""
    names = list(client.scan_iter(match=keys.WORKER_HEARTBEAT_PATTERN, count=500))
    bodies = client.mget(names) if names else []
    return [json.loads(body) for body in bodies if body is not None]
