"""The remote-functions worker step: does this worker take remote calls, and what it advertises.

A worker takes remote calls when it has the signing secret and serves a class configured for
them (``remote_classes``). Its heartbeat then says so, with the package environments it holds
(so calls needing one go to a worker that has it) and its GPU's memory.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from sluice.tasks.remote.classes import remote_catalog
from sluice.tasks.remote.heartbeat import RemoteBeat
from sluice.tasks.remote.settings import remote_settings
from sluice.workers.bootstep import SluiceWorkerStep
from sluice.workers.gpu import gpu_memory
from sluice.workers.remote.package_envs import EnvironmentCache


class RemoteWorkerStep(bootsteps.Step):
    """Adds the remote fields to the core step's heartbeat."""

    label = "sluice-remote"
    requires = (SluiceWorkerStep,)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        core: SluiceWorkerStep = worker.sluice
        settings = remote_settings(worker.app)
        self.settings = settings
        self.takes_calls = bool(worker.app.settings.signing_secret()) and any(
            rc.name in remote_catalog(worker.app) for rc in core.classes
        )
        self.envs = EnvironmentCache(settings.envs_path, settings.env_cache_size)
        self.gpu_memory = gpu_memory() if any(rc.is_gpu for rc in core.classes) else None
        core.add_heartbeat_fields(self.fields)

    def fields(self) -> dict[str, Any]:
        held = self.envs.held() if self.takes_calls and not self.settings.fresh_env_per_call else []
        return RemoteBeat(self.takes_calls, held, self.gpu_memory).fields()
