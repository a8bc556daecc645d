"""Where a remote call goes: the smallest class that takes remote calls and fits its memory and gpu,
and within it a live worker that already holds the call's package environment when one does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery.utils.nodenames import worker_direct

from sluice.queues.catalog import ResourceClass
from sluice.tasks.heartbeat import read_heartbeats
from sluice.tasks.remote.classes import remote_class
from sluice.tasks.remote.heartbeat import RemoteBeat

if TYPE_CHECKING:
    from sluice.app import App


@dataclass(frozen=True)
class Target:
    """A call's destination: the queue to publish on, and the class whose slot sizes it."""

    queue: Any
    resource_class: ResourceClass
    worker: str | None = None


def choose_target(app: App, memory: int, gpu: bool, gpu_memory: int | None, env_key: str | None, what: str) -> Target:
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
