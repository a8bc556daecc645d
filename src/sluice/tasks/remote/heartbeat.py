"""The heartbeat's remote fields: written by a worker that takes remote calls, read by the client
to send a call to a worker that already holds its package environment or enough GPU memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.tasks.heartbeat import WorkerBeat


@dataclass(frozen=True)
class RemoteBeat:
    """What a worker's heartbeat says about remote calls: whether it takes them, the package
    environments it holds (by key) and its GPU's memory. Flat fields of the heartbeat's JSON."""

    remote: bool = False
    envs: list[str] = field(default_factory=list)
    gpu_memory: int | None = None

    def fields(self) -> dict[str, Any]:
        return {"remote": self.remote, "envs": list(self.envs), "gpu_memory": self.gpu_memory}

    @classmethod
    def of(cls, beat: WorkerBeat) -> RemoteBeat:
        extra = beat.extra
        return cls(bool(extra.get("remote")), list(extra.get("envs") or []), extra.get("gpu_memory"))
