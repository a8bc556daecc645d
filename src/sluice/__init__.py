"""sluice: a Celery + Redis task queue that knows what each task needs."""

from sluice.app import App
from sluice.assets import Asset, AssetDef, CodeRepository, Executor, MaterializeResult
from sluice.client.remote import remote
from sluice.client.session import session
from sluice.compute import Compute
from sluice.config import Settings
from sluice.errors import (
    AttemptFailed,
    BrokerUnavailable,
    ConfigurationError,
    DefinitionError,
    GpuUnavailable,
    InvalidPackageError,
    InvalidRequestError,
    MemoryExhausted,
    MemoryKilled,
    NoQueueFits,
    RemoteError,
    RetriesExhausted,
    SerializationError,
    SluiceError,
    TaskFailed,
    Transient,
    WorkerLost,
)
from sluice.queues import Catalog, ResourceClass
from sluice.tasks.history import attempts
from sluice.tasks.retry import Backoff, ComputeEscalation, RetryOn, RetryPolicy

__all__ = [
    # core model
    "App",
    "Compute",
    "Settings",
    # resource classes
    "Catalog",
    "ResourceClass",
    # retries and escalation
    "RetryPolicy",
    "RetryOn",
    "ComputeEscalation",
    "Backoff",
    "Transient",
    "attempts",
    # assets
    "Asset",
    "AssetDef",
    "CodeRepository",
    "Executor",
    "MaterializeResult",
    # remote functions
    "remote",
    "session",
    # errors
    "SluiceError",
    "ConfigurationError",
    "DefinitionError",
    "NoQueueFits",
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
]
