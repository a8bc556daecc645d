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

from sluice import entries, keys
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
        """The payload; ValueError or TypeError if ``raw`` is not one (readers skip it then)."""
        data = entries.loads(raw)
        if not isinstance(data, dict):
            raise TypeError(f"a heartbeat is a JSON object, not {type(data).__name__}")
        core: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in data and f.name != "extra":
                core[f.name] = _typed(f.name, data[f.name], cls.__dataclass_fields__[f.name].default)
        return cls(**core, extra={k: v for k, v in data.items() if k not in core})


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

    def finish(self) -> None:
        """Once stopped, remove the key, so the worker is offline at once, not after the TTL. On
        this thread, after the last beat: no beat in flight can write the key again, and with
        Redis unreachable the worker exits without it (the key expires, and peers' reapers
        put back what it held, as for a worker that died)."""
        try:
            self.client.delete(self.key)
        except redis.RedisError:
            pass


def read_heartbeat(client: redis.Redis, hostname: str) -> WorkerBeat | None:
    """One worker's last heartbeat, if it is online."""
    raw = client.get(keys.worker_heartbeat(hostname))
    return None if raw is None else WorkerBeat.decode(raw)


def read_heartbeats(client: redis.Redis) -> list[WorkerBeat]:
    """Every live worker's last heartbeat (one that does not decode is skipped)."""
    names = list(client.scan_iter(match=keys.WORKER_HEARTBEAT_PATTERN, count=500))
    bodies = client.mget(names) if names else []
    return entries.decode_each("heartbeat", (body for body in bodies if body is not None), WorkerBeat.decode)


def _typed(name: str, value: Any, default: Any) -> Any:
    """A core field's value as its type (a tuple of strings for the listed ones), or TypeError."""
    if isinstance(default, tuple):
        fits = value is None or isinstance(value, list) and all(isinstance(item, str) for item in value)
        return tuple(value or ()) if fits else _mistyped(name, value)
    if isinstance(default, float):
        fits = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if fits else _mistyped(name, value)
    return value if type(value) is type(default) else _mistyped(name, value)


def _mistyped(name: str, value: Any) -> Any:
    raise TypeError(f"heartbeat field {name!r} holds {type(value).__name__} {value!r:.40}")
