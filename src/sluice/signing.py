"""Signatures: HMAC-SHA256 with the secret clients and workers share, checked before anything runs.

Unpickling is code execution, and so is loading a task file, so nothing sluice reads from Redis
is unpickled or run unless it is signed. A remote call travels as an ordinary JSON message (the
queues accept JSON only) whose payload is base64 text, and every field, payload included, is
covered by the HMAC (:func:`seal`/:func:`unseal`); a worker checks it before anything is
unpickled, the client checks the reply the same way. A batch run's stored task file and an asset
step's arguments are sealed the same way. Pickled bytes stored in Redis (asset values) carry the
HMAC in front of them (:func:`sign`/:func:`verify`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from sluice.errors import ConfigurationError, InvalidRequestError

SIGNATURE = "sig"
NO_SECRET = (
    "no signing secret (it signs remote calls, asset steps and values, and batch runs' task files): set "
    "SLUICE_REMOTE_SECRET (the same value on clients and workers), or run the export lines `sluice up` prints"
)
#: Signed bytes start with this, then the 32-byte HMAC of what follows.
SIGNED_BYTES = b"sluice-signed:1:"


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
        raise InvalidRequestError(f"refusing {what}: it is not signed (nothing was unpickled or run)")
    if not hmac.compare_digest(message[SIGNATURE], _digest(secret, message)):
        raise InvalidRequestError(
            f"refusing {what}: its signature does not match (tampered, or signed with another secret; "
            "nothing was unpickled or run)"
        )
    return {k: v for k, v in message.items() if k != SIGNATURE}


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def sign(secret: str | None, data: bytes) -> bytes:
    """``data`` with its HMAC in front, for storing pickled bytes in Redis."""
    if not secret:
        raise ConfigurationError(NO_SECRET)
    return SIGNED_BYTES + hmac.new(secret.encode(), data, hashlib.sha256).digest() + data


def verify(secret: str | None, blob: bytes, what: str) -> bytes:
    """The signed bytes when their HMAC is valid; :class:`InvalidRequestError` otherwise (nothing
    was unpickled)."""
    if not secret:
        raise InvalidRequestError(f"refusing {what}: this process has {NO_SECRET[0].lower()}{NO_SECRET[1:]}")
    digest, data = blob[len(SIGNED_BYTES) : len(SIGNED_BYTES) + 32], blob[len(SIGNED_BYTES) + 32 :]
    if not blob.startswith(SIGNED_BYTES) or len(digest) != 32:
        raise InvalidRequestError(f"refusing {what}: it is not signed (nothing was unpickled or run)")
    if not hmac.compare_digest(digest, hmac.new(secret.encode(), data, hashlib.sha256).digest()):
        raise InvalidRequestError(
            f"refusing {what}: its signature does not match (tampered, or signed with "
            "another secret; nothing was unpickled or run)"
        )
    return data
