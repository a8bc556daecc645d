"""The memory-kill record: what the watchdog saw when it killed a task, kept in Redis.

The watchdog writes it in the worker's main process just before the SIGKILL; the task's
``Request`` (:mod:`sluice.tasks.request`) reads it when the pool process is found dead, to tell a
memory kill from a crash. One encoder and one decoder, here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import redis

from sluice import keys
from sluice.units import format_size


@dataclass(frozen=True)
class MemoryKill:
    """A task killed for memory: its tree's resident bytes over its limit, where and when."""

    task_id: str
    task: str
    rss: int
    limit: int
    resource_class: str
    worker: str
    pid: int
    at: float  #: when it was killed (epoch seconds)

    @property
    def message(self) -> str:
        return (
            f"task {self.task}[{self.task_id}] killed for memory at {self.rss} bytes "
            f"({format_size(self.rss)}) over its limit of {self.limit} bytes ({format_size(self.limit)}) "
            f"on class {self.resource_class} (worker {self.worker})"
        )

    def encode(self) -> str:
        """JSON: the fields and the message (for a person reading the key)."""
        return json.dumps(asdict(self) | {"message": self.message})

    @classmethod
    def decode(cls, raw: bytes | str) -> MemoryKill:
        """The record; ValueError or TypeError if ``raw`` is not one (the message is derived again)."""
        data: Any = json.loads(raw)
        if not isinstance(data, dict):
            raise TypeError(f"a memory-kill record is a JSON object, not {type(data).__name__}")
        data.pop("message", None)
        return cls(**data)

    def store(self, pipe: Any) -> None:
        """Add the write to ``pipe`` (a pipeline or a client), kept ``keys.MEMORY_KILL_TTL`` seconds."""
        pipe.set(keys.memory_kill(self.task_id), self.encode(), ex=keys.MEMORY_KILL_TTL)


def read(client: redis.Redis, task_id: str) -> MemoryKill | None:
    """The task's memory-kill record, if the watchdog killed it."""
    raw = client.get(keys.memory_kill(task_id))
    return None if raw is None else MemoryKill.decode(raw)
