"""The heartbeat payload and its readers: a Redis key per worker, refreshed every few seconds.

Workers write it (:mod:`sluice.workers.heartbeat`); ``sluice status``, the autoscaler, the
delivery ledger, health probes and remote-call routing read it: which workers are online, which
classes they serve, how many slots they have and what they are running right now. A format both
sides read, so it lives here: :class:`WorkerBeat` is encoded and decoded only here; capabilities
add their own fields (``extra``) and decode them themselves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import redis

from sluice import entries, keys


@dataclass(frozen=True)
class WorkerBeat:
    """One worker's heartbeat payload."""

    hostname: str = ""
    instance: str = ""
    pid: int = 0
    queues: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    slots: int = 0
    running: tuple[str, ...] = ()  #: ids of the tasks running now
    ts: float = 0.0  #: when it was written (epoch seconds)
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
