"""sluice: a Celery + Redis task queue that knows what each task needs.

The public API is re-exported here and loaded on first use (PEP 562), so ``import
sluice.compute`` or ``sluice.units`` loads no Celery worker code and no capability.
:func:`default_capabilities` is the one list of what an App can do by default.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.capability import Capability

#: Public name -> the module that defines it.
_EXPORTS = {
    # core model
    "App": "sluice.app",
    "Compute": "sluice.compute",
    "Settings": "sluice.config",
    "Capability": "sluice.capability",
    # resource classes
    "Catalog": "sluice.queues.catalog",
    "ResourceClass": "sluice.queues.catalog",
    # tenants: who may use how much of a class
    "tenant": "sluice.tenants",
    "Share": "sluice.tenants",
    # retries and escalation
    "RetryPolicy": "sluice.tasks.retry",
    "RetryOn": "sluice.tasks.retry",
    "ComputeEscalation": "sluice.tasks.retry",
    "Backoff": "sluice.tasks.retry",
    "Transient": "sluice.errors",
    "attempts": "sluice.tasks.history",
    "Unique": "sluice.tasks.unique",
    "Limit": "sluice.tasks.limits",
    # assets
    "Asset": "sluice.assets",
    "AssetDef": "sluice.assets",
    "CodeRepository": "sluice.assets",
    "Executor": "sluice.assets",
    "MaterializeResult": "sluice.assets",
    # remote functions
    "remote": "sluice.client.remote",
    "session": "sluice.client.remote",
    # errors
    **{
        name: "sluice.errors"
        for name in (
            "SluiceError",
            "ConfigurationError",
            "DefinitionError",
            "NoQueueFits",
            "OverQuota",
            "GpuUnavailable",
            "BrokerUnavailable",
            "TaskFailed",
            "MemoryKilled",
            "WorkerLost",
            "AttemptFailed",
            "RetriesExhausted",
            "MemoryExhausted",
            "InvalidPackageError",
            "SerializationError",
            "InvalidRequestError",
            "RemoteError",
            "SandboxDied",
            "SandboxCrashed",
            "CallTimeout",
        )
    },
}

__all__ = [*_EXPORTS, "default_capabilities"]


def default_capabilities() -> list[Capability]:
    """What every App can do unless built with ``capabilities=``: batch runs, remote functions, assets."""
    # The capability list, the one way the core reaches a capability: imported when an App asks for
    # it, since each capability imports the App (and ``import sluice`` stays light).
    from sluice.assets.capability import ASSETS
    from sluice.workers.batch import BATCH
    from sluice.workers.remote import REMOTE

    return [BATCH, REMOTE, ASSETS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sluice' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
