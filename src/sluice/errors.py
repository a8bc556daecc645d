"""Every exception sluice raises, under one root.

    SluiceError
    ├── ConfigurationError        bad settings, sizes or options; raised when declared
    │   ├── NoQueueFits           no resource class can hold a task's compute
    │   └── GpuUnavailable        a worker asked to serve a gpu class has no GPU
    ├── BrokerUnavailable         the broker/redis-server cannot be reached or started
    └── TaskFailed                a task ended badly on a worker (travels as type + message)
        └── MemoryKilled          the watchdog killed the task for exceeding its memory

Errors that cross processes travel as data (type, module, message) in the result backend and
are rebuilt by Celery on the caller's side, so each class here takes one message string.
"""

from __future__ import annotations


class SluiceError(Exception):
    """Root of every sluice error."""


class ConfigurationError(SluiceError, ValueError):
    """A value given to sluice is not one it accepts; the message names it and the accepted forms."""


class NoQueueFits(ConfigurationError):
    """No resource class has a slot large enough for the task's compute."""


class GpuUnavailable(ConfigurationError):
    """A worker was asked to consume a gpu class on a machine without a GPU."""


class BrokerUnavailable(SluiceError):
    """The Redis broker could not be reached or the embedded one could not start."""


class TaskFailed(SluiceError):
    """A task failed on a worker for a reason sluice detected (not the task's own exception)."""


class MemoryKilled(TaskFailed):
    """The worker's memory watchdog killed the task for using more than its effective memory."""
