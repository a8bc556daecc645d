"""Retry policy and escalation as data and pure functions (unit-tested without a worker).

Precedence, where it is used: the attempt's compute comes from the message header
(``sluice_compute``, set by an escalation) over the task's declared compute over the app default.
"""

from __future__ import annotations

import enum
import socket
from dataclasses import dataclass, field
from typing import Any

from sluice.compute import Compute
from sluice.errors import ConfigurationError, Transient
from sluice.queues.catalog import Catalog
from sluice.units import format_memory, parse_memory, real_number


class RetryOn(enum.Enum):
    """Which failures a policy retries."""

    NEVER = "never"  #: nothing
    OOM = "oom"  #: memory kills only (watchdog, SIGKILL, a worker that died mid-task)
    TRANSIENT = "transient"  #: memory kills, lost workers and transient exceptions; never business errors
    ANY = "any"  #: every failure, business exceptions included


class Reason(enum.Enum):
    """Why an attempt ended without a result."""

    MEMORY = "memory"  #: the watchdog killed it, or something sent SIGKILL (kernel OOM killer)
    WORKER_LOST = "worker lost"  #: the whole worker died mid-task (an OOMKilled pod)
    LOST = "lost"  #: the pool process exited some other way
    TRANSIENT = "transient"  #: a transient exception (connection error, timeout, sluice.Transient)
    ERROR = "error"  #: any other exception: a business failure

    @property
    def memory_like(self) -> bool:
        """Failures that more memory may fix: they escalate."""
        return self in (Reason.MEMORY, Reason.WORKER_LOST)


_RETRIED = {
    RetryOn.NEVER: frozenset(),
    RetryOn.OOM: frozenset({Reason.MEMORY, Reason.WORKER_LOST}),
    RetryOn.TRANSIENT: frozenset({Reason.MEMORY, Reason.WORKER_LOST, Reason.LOST, Reason.TRANSIENT}),
    RetryOn.ANY: frozenset(Reason),
}

#: Exceptions that say "try again later", not "this input is bad".
TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (Transient, ConnectionError, TimeoutError, socket.timeout)


def classify(exc: BaseException) -> Reason:
    """TRANSIENT for connection errors, timeouts and :class:`sluice.Transient`; ERROR otherwise."""
    return Reason.TRANSIENT if isinstance(exc, TRANSIENT_EXCEPTIONS) else Reason.ERROR


#: Growth factors (escalation, backoff) beyond this are typos, and overflow sizes and delays.
MAX_FACTOR = 1000.0
#: The longest backoff delay, in seconds: a day.
MAX_DELAY = 86_400.0


@dataclass(frozen=True)
class ComputeEscalation:
    """After a memory kill: ``memory = min(memory * factor, max_memory)``."""

    factor: float = 2.0
    max_memory: str | int = "64Gi"
    max_memory_bytes: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        real_number(self.factor, "ComputeEscalation factor", 1, MAX_FACTOR, low_open=True)
        object.__setattr__(self, "max_memory_bytes", parse_memory(self.max_memory))

    def next_memory(self, memory_bytes: int) -> int:
        return min(int(memory_bytes * self.factor), self.max_memory_bytes)


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``n`` (1-based): ``min(initial * factor**(n-1), maximum)`` seconds."""

    initial: float = 1.0
    factor: float = 2.0
    maximum: float = 60.0

    def __post_init__(self) -> None:
        real_number(self.initial, "Backoff initial", 0, MAX_DELAY)
        real_number(self.factor, "Backoff factor", 1, MAX_FACTOR)
        real_number(self.maximum, "Backoff maximum", 0, MAX_DELAY)
        if self.maximum < self.initial:
            raise ConfigurationError(
                f"Backoff(initial={self.initial}, factor={self.factor}, maximum={self.maximum}) needs "
                "initial >= 0, factor >= 1 and maximum >= initial"
            )

    def delay(self, retry: int) -> float:
        try:
            grown = self.initial * self.factor ** max(retry - 1, 0)
        except OverflowError:  # a large factor after many retries: the cap applies
            grown = self.maximum
        return min(grown, self.maximum)


@dataclass(frozen=True)
class RetryPolicy:
    """``RetryPolicy(max_retries=3, retry_on=RetryOn.TRANSIENT, escalate=ComputeEscalation(...))``.

    A memory kill that escalates is retried at once (the bigger size is the remedy); every other
    retry waits ``backoff.delay(n)``.
    """

    max_retries: int = 3
    retry_on: RetryOn = RetryOn.TRANSIENT
    escalate: ComputeEscalation | None = None
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ConfigurationError(f"RetryPolicy max_retries={self.max_retries!r} must be a whole number >= 0")
        if not isinstance(self.retry_on, RetryOn):
            raise ConfigurationError(
                f"RetryPolicy retry_on={self.retry_on!r} must be one of "
                f"{', '.join(f'RetryOn.{r.name}' for r in RetryOn)}"
            )
        if self.escalate is not None and not isinstance(self.escalate, ComputeEscalation):
            raise ConfigurationError(f"RetryPolicy escalate={self.escalate!r} must be a ComputeEscalation")
        if not isinstance(self.backoff, Backoff):
            raise ConfigurationError(f"RetryPolicy backoff={self.backoff!r} must be a Backoff")

    @property
    def max_attempts(self) -> int:
        return self.max_retries + 1

    def describe(self) -> str:
        """Short human form for tables: ``3 retries on OOM, memory x2 up to 64Gi``."""
        text = f"{self.max_retries} retries on {self.retry_on.name}"
        if self.escalate is not None:
            text += f", memory x{self.escalate.factor:g} up to {format_memory(self.escalate.max_memory_bytes)}"
        return text

    def retries(self, reason: Reason) -> bool:
        return reason in _RETRIED[self.retry_on]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form, for a policy that travels with a message (asset steps)."""
        escalate = self.escalate
        return {
            "max_retries": self.max_retries,
            "retry_on": self.retry_on.value,
            "escalate": None
            if escalate is None
            else {"factor": escalate.factor, "max_memory": escalate.max_memory_bytes},
            "backoff": {
                "initial": self.backoff.initial,
                "factor": self.backoff.factor,
                "maximum": self.backoff.maximum,
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RetryPolicy:
        escalate = data.get("escalate")
        return cls(
            max_retries=data["max_retries"],
            retry_on=RetryOn(data["retry_on"]),
            escalate=ComputeEscalation(**escalate) if escalate else None,
            backoff=Backoff(**data["backoff"]),
        )

    def check(self, compute: Compute, catalog: Catalog, task_name: str) -> None:
        """Declaration-time checks against the task's effective compute and the catalog."""
        if self.escalate is None:
            return
        ceiling = self.escalate.max_memory_bytes
        if compute.memory_bytes is not None and ceiling < compute.memory_bytes:
            raise ConfigurationError(
                f"{task_name}: escalation max_memory={format_memory(ceiling)} is below the task's memory "
                f"{compute.memory}; it must be at least that"
            )
        catalog.route(compute.replace(memory_bytes=ceiling), f"{task_name} escalated to max_memory")


@dataclass(frozen=True)
class Decision:
    """What happens after an attempt ends without a result."""

    retry: bool
    compute: Compute
    countdown: float = 0.0
    exhausted: bool = False  #: the policy would retry this reason but has no attempts (or memory) left


def decide(policy: RetryPolicy | None, compute: Compute, attempt: int, reason: Reason) -> Decision:
    """The next step for ``attempt`` (1-based) that ran at ``compute`` and ended for ``reason``."""
    if policy is None or not policy.retries(reason):
        return Decision(retry=False, compute=compute)
    if attempt >= policy.max_attempts:
        return Decision(retry=False, compute=compute, exhausted=True)
    if reason.memory_like and policy.escalate is not None:
        current = compute.memory_bytes or 0
        if current >= policy.escalate.max_memory_bytes:
            return Decision(retry=False, compute=compute, exhausted=True)
        return Decision(retry=True, compute=compute.replace(memory_bytes=policy.escalate.next_memory(current)))
    return Decision(retry=True, compute=compute, countdown=policy.backoff.delay(attempt))


@dataclass(frozen=True)
class AttemptRecord:
    """One entry of a task's attempt history: an attempt that ended without a result. Kept in
    Redis (:mod:`sluice.tasks.history`) and carried, encoded, by ``AttemptFailed.history`` and
    ``sluice.attempts()``; encoded by :meth:`encode` and decoded by :meth:`decode` only."""

    attempt: int
    queue: str
    compute: Compute
    reason: Reason
    detail: str
    worker: str

    def encode(self) -> dict[str, Any]:
        """JSON-safe form (what callers read)."""
        return {
            "attempt": self.attempt,
            "queue": self.queue,
            "compute": self.compute.to_dict(),
            "reason": self.reason.value,
            "detail": self.detail,
            "worker": self.worker,
        }

    @classmethod
    def decode(cls, data: Any) -> AttemptRecord:
        """The record; ValueError, TypeError or KeyError if ``data`` is not one (readers skip it)."""
        if not isinstance(data, dict):
            raise TypeError(f"an attempt record is a JSON object, not {type(data).__name__}")
        attempt = data["attempt"]
        if isinstance(attempt, bool) or not isinstance(attempt, int):
            raise TypeError(f"an attempt record's attempt is a whole number, not {attempt!r:.40}")
        text = {name: data[name] for name in ("queue", "detail", "worker")}
        for name, value in text.items():
            if not isinstance(value, str):
                raise TypeError(f"an attempt record's {name} is a string, not {value!r:.40}")
        return cls(
            attempt,
            text["queue"],
            Compute.from_dict(data["compute"]),
            Reason(data["reason"]),
            text["detail"],
            text["worker"],
        )

    def describe(self) -> str:
        """``killed for memory at 8Gi on cpu`` / ``worker lost at 8Gi on cpu`` / ``transient: ... on cpu``."""
        memory = self.compute.memory or "?"
        if self.reason is Reason.MEMORY:
            return f"killed for memory at {memory} on {self.queue}"
        if self.reason in (Reason.WORKER_LOST, Reason.LOST):
            return f"{self.reason.value} at {memory} on {self.queue} ({self.detail})"
        return f"{self.reason.value}: {self.detail} on {self.queue}"


def summarize(task_name: str, history: list[AttemptRecord]) -> str:
    """The final failure message: every attempt, in order."""
    return f"{task_name} failed after {len(history)} attempt(s): " + ", ".join(r.describe() for r in history)
