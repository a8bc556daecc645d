"""Where a remote call goes: the smallest class that takes remote calls and fits its memory and gpu,
and within it a live worker that already holds the call's package environment when one does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery.utils.nodenames import worker_direct

from sluice.client.remote.settings import check_classes, remote_settings
from sluice.compute import Compute
from sluice.queues.catalog import Catalog, ResourceClass
from sluice.tasks.heartbeat import WorkerBeat, read_heartbeats

if TYPE_CHECKING:
    from sluice.app import App


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


def remote_catalog(app: App) -> Catalog:
    """The classes configured to run remote calls (``remote_classes``; default: all of them)."""
    names = remote_settings(app).remote_classes
    if names is None:
        return app.catalog
    check_classes(names, app.catalog)  # checked at load against the configured catalog; App(classes=) may differ
    return Catalog(app.catalog.get(n) for n in names)


def accepts_remote(app: App, routing_key: str, hostname: str | None) -> bool:
    """Whether a message delivered on ``routing_key`` may run a remote call on this worker: a
    remote class's queue, or this worker's own direct queue when it serves a remote class."""
    catalog = remote_catalog(app)
    if routing_key in catalog:
        return True
    if hostname and routing_key == worker_direct(hostname).name:
        consumed = app.amqp.queues.consume_from or {}
        return any(name in catalog for name in consumed)
    return False


def remote_class(app: App, memory: int, gpu: bool, what: str) -> ResourceClass:
    """The smallest remote class whose slot holds ``memory`` (and a GPU when asked)."""
    return remote_catalog(app).route(Compute.of(memory_bytes=memory, gpu=1 if gpu else None), what)


@dataclass(frozen=True)
class Target:
    """A call's destination: the queue to publish on, and the class whose slot sizes it."""

    queue: Any
    resource_class: ResourceClass
    worker: str | None = None


def choose_target(app: App, memory: int, gpu: bool, gpu_memory: int | None, env_key: str | None,
                  what: str) -> Target:
    """The smallest class that fits; within it, a live worker holding ``env_key`` (or, with
    ``gpu_memory``, one whose GPU has that much) is chosen through its own queue. A bigger class
    is never taken just because one of its workers holds the environment."""
    home = remote_class(app, memory, gpu, what)
    if env_key is None and gpu_memory is None:
        return Target(home.name, home)
    candidates = []
    for beat in read_heartbeats(app.redis):
        remote = RemoteBeat.of(beat)
        if home.name not in beat.classes or not remote.remote:
            continue
        if gpu_memory is not None and (remote.gpu_memory or 0) < gpu_memory:
            continue
        holds = env_key is not None and env_key in remote.envs
        if holds or gpu_memory is not None:
            candidates.append((holds, beat.hostname))
    if not candidates:  # none live yet (a class scaled to zero): the class queue; workers check GPU memory
        return Target(home.name, home)
    best = max(holds for holds, _ in candidates)
    hostname = random.choice([host for holds, host in candidates if holds == best])
    return Target(worker_direct(hostname), home, hostname)
