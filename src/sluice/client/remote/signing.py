"""Signed messages for remote calls: HMAC-SHA256 over the whole message, checked before unpickling.

A remote call carries a cloudpickle payload, and unpickling is code execution. So the call
travels as an ordinary JSON message (the queues accept JSON only) whose payload is base64 text,
and every field, payload included, is covered by an HMAC made with a secret shared by clients
and workers. A worker checks the HMAC before anything is unpickled; the client checks the
worker's reply the same way.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from sluice.errors import ConfigurationError, InvalidRequestError

SIGNATURE = "sig"
NO_SECRET = ("no signing secret for remote calls: set SLUICE_REMOTE_SECRET (the same value on clients and "
             "workers), or run the export lines `sluice up` prints")


def _digest(secret: str, fields: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in fields.items() if k != SIGNATURE}, sort_keys=True, separators=(",", ":"))
    return hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()


def seal(secret: str | None, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` plus its signature; every value must be JSON."""
    if not secret:
        raise ConfigurationError(NO_SECRET)
    return {**fields, SIGNATURE: _digest(secret, fields)}


def unseal(secret: str | None, message: object, what: str = "remote call") -> dict[str, Any]:
    """The message's fields when its signature is valid; :class:`InvalidRequestError` otherwise."""
    if not secret:
        raise InvalidRequestError(f"refusing {what}: this process has {NO_SECRET[0].lower()}{NO_SECRET[1:]}")
    if not isinstance(message, dict) or not isinstance(message.get(SIGNATURE), str):
        raise InvalidRequestError(f"refusing {what}: it is not signed (nothing was unpickled)")
    if not hmac.compare_digest(message[SIGNATURE], _digest(secret, message)):
        raise InvalidRequestError(
            f"refusing {what}: its signature does not match (tampered, or signed with another secret; "
            "nothing was unpickled)")
    return {k: v for k, v in message.items() if k != SIGNATURE}


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))
