"""A remote call's contract: the names its tasks are registered under, the Python version the
client stamps on a call and the worker checks (cloudpickle needs the same major.minor), and the
call's and the reply's fields, each with one encoder and one decoder. Both travel signed
(:mod:`sluice.signing`); the pickled function and value travel base64-encoded inside them."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from sluice import signing

#: A remote function's call: one signed call run in a fresh (or cached) sandbox.
REMOTE_TASK = "sluice.remote.call"
#: A session: one sandbox on one worker serving calls through Redis lists until it is closed.
SESSION_TASK = "sluice.remote.session"
#: The version of the call's fields.
PROTOCOL = 1


def python_version() -> str:
    """major.minor: cloudpickle needs the same on both sides of a call."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


@dataclass(frozen=True)
class Call:
    """What a call asks of a worker: the function's name, the packages and sizes it needs, and the
    pickled call (``payload``; empty for a session's opening message, which names the session)."""

    function: str
    python: str
    packages: tuple[str, ...]
    memory: int
    payload: bytes
    hints: tuple[str, ...] = ()
    max_memory: int | None = None
    gpu: bool = False
    gpu_memory: int | None = None
    max_gpu_memory: int | None = None
    stream: bool = False
    session: str | None = None  #: the session this message opens
    lease: float | None = None  #: the session's lease, in seconds

    def encode(self) -> dict[str, Any]:
        """The fields to sign (JSON)."""
        fields = {
            "protocol": PROTOCOL,
            "function": self.function,
            "python": self.python,
            "packages": list(self.packages),
            "hints": list(self.hints),
            "memory": self.memory,
            "max_memory": self.max_memory,
            "gpu": self.gpu,
            "gpu_memory": self.gpu_memory,
            "max_gpu_memory": self.max_gpu_memory,
            "stream": self.stream,
            "payload": signing.encode(self.payload),
        }
        if self.session is not None:
            fields |= {"session": self.session, "lease": self.lease}
        return fields

    @classmethod
    def decode(cls, fields: dict[str, Any]) -> Call:
        """From unsealed fields; KeyError when a required one is missing."""
        session = fields.get("session")
        return cls(
            str(fields["function"]),
            str(fields.get("python")),
            tuple(fields["packages"]),
            int(fields["memory"]),
            signing.decode(fields["payload"]),
            tuple(fields.get("hints") or ()),
            fields.get("max_memory"),
            bool(fields.get("gpu")),
            fields.get("gpu_memory"),
            fields.get("max_gpu_memory"),
            bool(fields.get("stream")),
            None if session is None else str(session),
            fields.get("lease"),
        )


@dataclass(frozen=True)
class Reply:
    """A call's outcome as the worker sends it back: the pickled ``("ok", value)`` or
    ``("err", ...)``, the output lines, the memory limits the sandbox went through, the attempt
    and the worker."""

    payload: bytes
    output: list[str]
    limits: list[int]
    attempt: int
    worker: str | None

    def encode(self) -> dict[str, Any]:
        """The fields to sign (JSON)."""
        return {
            "payload": signing.encode(self.payload),
            "output": list(self.output),
            "limits": list(self.limits),
            "attempt": self.attempt,
            "worker": self.worker,
        }

    @classmethod
    def decode(cls, fields: dict[str, Any]) -> Reply:
        """From unsealed fields; KeyError when a required one is missing."""
        return cls(
            signing.decode(fields["payload"]),
            list(fields["output"]),
            list(fields["limits"]),
            int(fields["attempt"]),
            fields.get("worker"),
        )
