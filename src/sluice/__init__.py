"""sluice: a Celery + Redis task queue that knows what each task needs."""

from sluice.app import App
from sluice.compute import Compute
from sluice.config import Settings
from sluice.errors import (
    BrokerUnavailable,
    ConfigurationError,
    GpuUnavailable,
    MemoryKilled,
    NoQueueFits,
    SluiceError,
    TaskFailed,
)
from sluice.queues import Catalog, ResourceClass

__all__ = [
    # core model
    "App",
    "Compute",
    "Settings",
    # resource classes
    "Catalog",
    "ResourceClass",
    # errors
    "SluiceError",
    "ConfigurationError",
    "NoQueueFits",
    "GpuUnavailable",
    "BrokerUnavailable",
    "TaskFailed",
    "MemoryKilled",
]
