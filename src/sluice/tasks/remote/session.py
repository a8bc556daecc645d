"""A remote session's messages: the calls the client pushes to the session's ``calls`` list and
the replies the worker pushes to its ``replies`` list (keys: ``sluice.keys.session``), each signed
like a call, each with one encoder and one decoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice import signing


@dataclass(frozen=True)
class SessionCall:
    """Call number ``n`` of a session (its pickled call in ``payload``), or the client's ``close``."""

    n: int = 0
    payload: bytes = b""
    close: bool = False

    def encode(self) -> dict[str, Any]:
        """The fields to sign (JSON)."""
        return {"close": True} if self.close else {"n": self.n, "payload": signing.encode(self.payload)}

    @classmethod
    def decode(cls, fields: dict[str, Any]) -> SessionCall:
        """From unsealed fields; KeyError when a required one is missing."""
        if fields.get("close"):
            return cls(close=True)
        return cls(int(fields["n"]), signing.decode(fields["payload"]))


@dataclass(frozen=True)
class SessionReply:
    """The reply to call ``n``: its pickled outcome, or the error that ended the session (and
    whether it was memory), with the call's output lines and the sandbox's limits so far."""

    n: int
    worker: str | None
    output: list[str]
    limits: list[int]
    payload: bytes | None = None
    error: str | None = None
    memory: bool = False  #: the error was the sandbox running out of memory

    def encode(self) -> dict[str, Any]:
        """The fields to sign (JSON)."""
        outcome = (
            {"error": self.error, "memory": self.memory}
            if self.error is not None
            else {"payload": signing.encode(self.payload or b"")}
        )
        return {"n": self.n, "worker": self.worker, **outcome, "output": list(self.output), "limits": list(self.limits)}

    @classmethod
    def decode(cls, fields: dict[str, Any]) -> SessionReply:
        """From unsealed fields; KeyError when a required one is missing."""
        error = fields.get("error")
        payload = None if error else signing.decode(fields["payload"])
        return cls(
            int(fields["n"]),
            fields.get("worker"),
            list(fields["output"]),
            list(fields["limits"]),
            payload,
            error or None,
            bool(fields.get("memory")),
        )
