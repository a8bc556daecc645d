"""Every exception sluice raises, under one root.

    SluiceError
    ├── ConfigurationError        bad settings, sizes or options; raised when declared
    │   ├── NoQueueFits           no resource class can hold a task's compute
    │   ├── OverQuota             a task is larger than its tenant's quota on its class: it could never start
    │   ├── DefinitionError       an asset graph is wrong: unknown dependency, cycle, duplicate
    │   ├── GpuUnavailable        a worker asked to serve a gpu class has no GPU
    │   └── InvalidPackageError   a remote function's packages= entry is not a PEP 508 requirement
    ├── BrokerUnavailable         the broker/redis-server cannot be reached or started
    ├── DataDirInUse              another process already runs an embedded Redis on this data dir
    ├── ClusterUnavailable        no Kubernetes cluster to talk to: no kubeconfig, no answer (exit 69)
    ├── MissingExtra              a command needs an optional dependency that is not installed
    ├── TaskFailed                a task ended badly on a worker (travels as type + message)
    │   ├── MemoryKilled          the watchdog killed the task for exceeding its memory
    │   ├── WorkerLost            the process (or whole worker) running the task died
    │   ├── AttemptFailed         one attempt failed and another follows (the RETRY state's info)
    │   ├── RetriesExhausted      the retry policy is spent; the message lists every attempt
    │   │   └── MemoryExhausted   killed for memory at the policy's max_memory (or out of retries)
    │   ├── RemoteError           a remote function raised an exception that cannot be rebuilt here
    │   └── SandboxCrashed        a session's sandbox died without a memory kill (exit code or signal)
    ├── Transient                 raised by a task: "retry me" under RetryOn.TRANSIENT
    ├── SerializationError        a remote call's function or arguments cannot travel (live resources)
    ├── InvalidRequestError       a worker refused a remote call: bad signature, Python version
    │                             mismatch, a queue that takes no remote calls, failed install
    ├── CallTimeout               a remote call did not finish in time (also a TimeoutError)
    ├── SubmitInterrupted         delay_many stopped midway; holds the calls that went out
    ├── ValueMissing              an asset has no value: it did not succeed, or it expired (a KeyError)
    └── SandboxDied               inside a worker: a sandbox ended without a complete reply

Errors that cross processes travel as data (type, module, message) in the result backend and
are rebuilt by Celery on the caller's side, so each class here takes one message string.
"""

from __future__ import annotations

from typing import Any


class SluiceError(Exception):
    """Root of every sluice error."""

    #: What the ``sluice`` command exits with when this error ends it (2: a usage error).
    exit_code = 2


class ConfigurationError(SluiceError, ValueError):
    """A value given to sluice is not one it accepts; the message names it and the accepted forms."""


class NoQueueFits(ConfigurationError):
    """No resource class has a slot large enough for the task's compute."""


class OverQuota(ConfigurationError):
    """A task needs more than its tenant's quota on its class allows: it could never start."""


class DefinitionError(ConfigurationError):
    """An asset or asset graph is defined wrongly; the message names the assets involved."""


class InvalidPackageError(ConfigurationError):
    """A ``packages=`` entry of a remote function is not a PEP 508 requirement."""


class GpuUnavailable(ConfigurationError):
    """A worker was asked to consume a gpu class on a machine without a GPU."""


class BrokerUnavailable(SluiceError):
    """The Redis broker could not be reached or the embedded one could not start."""


class DataDirInUse(SluiceError):
    """Another process already serves this data dir with its embedded Redis (the message names it)."""


class ClusterUnavailable(SluiceError):
    """No Kubernetes cluster to talk to: no in-cluster account and no usable kubeconfig, or an
    API server that does not answer. Exits 69 (EX_UNAVAILABLE), apart from ``deploy diff``'s 1."""

    exit_code = 69


class MissingExtra(SluiceError, ImportError):
    """A command needs an optional dependency that is not installed; the message names the extra."""


class TaskFailed(SluiceError):
    """A task failed on a worker for a reason sluice detected (not the task's own exception)."""


class MemoryKilled(TaskFailed):
    """The worker's memory watchdog killed the task for using more than its effective memory."""


class WorkerLost(TaskFailed):
    """The pool process or the whole worker running the task died without a result."""


class _WithHistory(TaskFailed):
    """A failure that carries the attempt history: ``.history`` is a list of attempt dicts.

    Both arguments are JSON-safe, so the exception travels through the result backend as data
    and is rebuilt with its history on the caller's side.
    """

    def __init__(self, message: str, history: list | None = None) -> None:
        super().__init__(message, history or [])
        self.message = message
        self.history = history or []

    def __str__(self) -> str:
        return self.message


class AttemptFailed(_WithHistory):
    """An attempt failed and a retry was published: what ``AsyncResult.info`` holds in RETRY."""


class RetriesExhausted(_WithHistory):
    """The retry policy is spent; the message lists every attempt."""


class MemoryExhausted(RetriesExhausted):
    """The task was killed for memory at its policy's max_memory, or ran out of retries escalating."""


class Transient(SluiceError):
    """Raise this in a task to say the failure is temporary: retried under RetryOn.TRANSIENT."""


class SerializationError(SluiceError, TypeError):
    """A remote function, its arguments or its value cannot be pickled; the message names the object."""


class InvalidRequestError(SluiceError):
    """A worker could not run a remote call as sent; the message says why (installer output included)."""


class RemoteError(TaskFailed):
    """The remote function raised an exception whose class cannot be rebuilt on the caller's side.

    The message holds the exception's type and message and the remote traceback.
    """


class SandboxCrashed(TaskFailed):
    """A session's sandbox died without being killed for memory; the message gives its exit code or signal."""


class SubmitInterrupted(SluiceError):
    """``task.delay_many`` stopped midway. ``published`` (a ``BulkResult``) went out and each ends
    as any task does; ``uncertain`` is the chunk Redis was being sent when it failed: some of it
    may have gone out. It never crosses processes, so it carries them as attributes."""

    def __init__(self, message: str, published: Any = None, uncertain: Any = None) -> None:
        super().__init__(message)
        self.published, self.uncertain = published, uncertain


class CallTimeout(SluiceError, TimeoutError):
    """A remote call did not finish within the caller's timeout (the call itself may still run)."""


class ValueMissing(SluiceError, KeyError):
    """An asset has no value: its step did not succeed, or its stored value expired."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class SandboxDied(SluiceError):
    """Inside a worker: a sandbox ended without a complete reply. ``killed_at`` is the limit it was
    killed at when the memory monitor killed it (None: it crashed or exited by itself)."""

    def __init__(self, message: str, killed_at: int | None = None) -> None:
        super().__init__(message)
        self.killed_at = killed_at

    @property
    def memory(self) -> bool:
        return self.killed_at is not None
