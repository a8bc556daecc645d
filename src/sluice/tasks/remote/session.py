"""A remote session's messages: the calls the client pushes to the session's ``calls`` list and
the replies the worker pushes to its ``replies`` list (keys: ``sluice.keys.session``), each signed
like a call and naming its session, so a signed message copied into another session's list is
refused; each with one encoder and one decoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice import signing
from sluice.errors import InvalidRequestError


def _of_session(fields: dict[str, Any], session: str, what: str) -> None:
    """Refuse a message signed for another session (nothing of it is unpickled)."""
    if fields.get("session") != session:
        raise InvalidRequestError(
            f"refusing {what} of session {session!r}: it is signed for session {fields.get('session')!r} "
            "(copied from another session; nothing was unpickled)"
        )


@dataclass(frozen=True)
class SessionCall:
    """Call number ``n`` of a session (its pickled call in ``payload``), or the client's ``close``."""

    session: str
    n: int = 0
    payload: bytes = b""
    close: bool = False

    def encode(self) -> dict[str, Any]:
        """The fields to sign (JSON)."""
        if self.close:
            return {"session": self.session, "close": True}
        return {"session": self.session, "n": self.n, "payload": signing.encode(self.payload)}

    @classmethod
    def decode(cls, fields: dict[str, Any], session: str) -> SessionCall:
        """From unsealed fields; KeyError when a required one is missing, InvalidRequestError when
        they are signed for another session."""
        _of_session(fields, session, "a call")
        if fields.get("close"):
            return cls(session, close=True)
        return cls(session, int(fields["n"]), signing.decode(fields["payload"]))


@dataclass(frozen=True)
class SessionReply:
    """The reply to call ``n``: its pickled outcome, or the error that ended the session (and
    whether it was memory), with the call's output lines and the sandbox's limits so far."""

    session: str
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
        return {
            "session": self.session,
            "n": self.n,
            "worker": self.worker,
            **outcome,
            "output": list(self.output),
            "limits": list(self.limits),
        }

    @classmethod
    def decode(cls, fields: dict[str, Any], session: str) -> SessionReply:
        """From unsealed fields; KeyError when a required one is missing, InvalidRequestError when
        they are signed for another session."""
        _of_session(fields, session, "a reply")
        error = fields.get("error")
        payload = None if error else signing.decode(fields["payload"])
        return cls(
            session,
            int(fields["n"]),
            fields.get("worker"),
            list(fields["output"]),
            list(fields["limits"]),
            payload,
            error or None,
            bool(fields.get("memory")),
        )
