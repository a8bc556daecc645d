"""Worker heartbeat: a Redis key per worker, refreshed every few seconds, gone when it dies.

``sluice status``, the autoscaler, the delivery ledger, health probes and remote-call routing
read these keys: which workers are online, which classes they serve, how many slots they have
and what they are running right now. :class:`WorkerBeat` is the payload, encoded and decoded
only here; capabilities add their own fields (``extra``) and decode them themselves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import redis

from sluice import keys
from sluice.workers.periodic import Periodic


@dataclass(frozen=True)
class WorkerBeat:
    """One worker's heartbeat payload."""

    hostname: str = ""
    instance: str = ""
    pid: int = 0
    queues: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    slots: int = 0
    running: tuple[str, ...] = ()   #: ids of the tasks running now
    ts: float = 0.0                 #: when it was written (epoch seconds)
    extra: Mapping[str, Any] = field(default_factory=dict)  #: fields a capability adds (flat in the JSON)

    def encode(self) -> str:
        core = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        clash = set(core) & set(self.extra)
        if clash:
            raise ValueError(f"heartbeat fields {sorted(clash)} are sluice's own; a capability must use other names")
        return json.dumps({**core, **self.extra})

    @classmethod
    def decode(cls, raw: bytes | str) -> WorkerBeat:
        data = json.loads(raw)
        names = {f.name for f in fields(cls)} - {"extra"}
        core = {k: v for k, v in data.items() if k in names}
        for listed in ("queues", "classes", "running"):
            core[listed] = tuple(core.get(listed) or ())
        return cls(**core, extra={k: v for k, v in data.items() if k not in names})


class Heartbeat(Periodic):
    """Writes ``payload()`` to the worker's heartbeat key every ``interval`` seconds.

    The key lives ``TTL_BEATS`` intervals, so a worker is taken for dead after missing that many.
    """

    TTL_BEATS = 5
    tick_first = True

    def __init__(self, client: redis.Redis, hostname: str, payload: Callable[[], WorkerBeat],
                 interval: float = 2.0, also: Callable[[Any], None] | None = None, also_every: int = 15) -> None:
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

    def stop(self) -> None:
        """Stop beating and remove the key, so the worker is offline at once, not after the TTL."""
        super().stop()
        try:
            self.client.delete(self.key)
        except redis.RedisError:
            pass


def read_heartbeat(client: redis.Redis, hostname: str) -> WorkerBeat | None:
    """One worker's last heartbeat, if it is online."""
    raw = client.get(keys.worker_heartbeat(hostname))
    return None if raw is None else WorkerBeat.decode(raw)


def read_heartbeats(client: redis.Redis) -> list[WorkerBeat]:
    """Every live worker's last heartbeat."""
    names = list(client.scan_iter(match=keys.WORKER_HEARTBEAT_PATTERN, count=500))
    bodies = client.mget(names) if names else []
    return [WorkerBeat.decode(body) for body in bodies if body is not None]
