"""The heartbeat writer: a worker's key, refreshed every few seconds, gone when it dies.

The payload and its readers are :mod:`sluice.tasks.heartbeat` (both sides read it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import redis

from sluice import keys
from sluice.tasks.heartbeat import WorkerBeat
from sluice.workers.periodic import Periodic


class Heartbeat(Periodic):
    """Writes ``payload()`` to the worker's heartbeat key every ``interval`` seconds.

    The key lives ``TTL_BEATS`` intervals, so a worker is taken for dead after missing that many.
    """

    TTL_BEATS = 5
    tick_first = True

    def __init__(
        self,
        client: redis.Redis,
        hostname: str,
        payload: Callable[[], WorkerBeat],
        interval: float = 2.0,
        also: Callable[[Any], None] | None = None,
        also_every: int = 15,
    ) -> None:
        """``also(pipeline)`` adds writes to the first beat and every ``also_every``-th after it
        (the task catalog), in the same round trip."""
        super().__init__("sluice-heartbeat", interval)
        self.client = client
        self.key = keys.worker_heartbeat(hostname)
        self.payload = payload
        self.also, self.also_every = also, also_every
        self._beats = 0

    def tick(self) -> None:
        body = replace(self.payload(), ts=time.time()).encode()
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.key, body, px=int(self.interval * self.TTL_BEATS * 1000))
        if self.also is not None and self._beats % self.also_every == 0:
            self.also(pipe)
        pipe.execute()
        self._beats += 1

    def finish(self) -> None:
        """Once stopped, remove the key, so the worker is offline at once, not after the TTL. On
        this thread, after the last beat: no beat in flight can write the key again, and with
        Redis unreachable the worker exits without it (the key expires, and peers' reapers
        put back what it held, as for a worker that died)."""
        try:
            self.client.delete(self.key)
        except redis.RedisError:
            pass
