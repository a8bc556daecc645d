"""The records of a batch run, one per item: the one schema, one encoder and one decoder.

A worker encodes each record once; the same line goes to the run's result cache (a Redis hash),
to the driver (the ``ready`` list) and, through the driver, to the sink (``ready.ndjson`` or
``failures.ndjson``). ``id`` is always the first key (every line starts with ``ID_PREFIX``), so
resume can read a million ids by slicing them out of lines instead of parsing them; a test pins that.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

FAILED, CANCELLED = "failed", "cancelled"
#: Every encoded record starts with this (the id follows, as a JSON string).
ID_PREFIX = json.dumps({"id": ""})[:-2]


@dataclass(frozen=True)
class Ready:
    """An item ``execute()`` returned for."""

    id: str
    result: Any
    worker: str | None
    attempts: int
    started: float
    seconds: float


@dataclass(frozen=True)
class Failure:
    """An item that failed (``execute()`` raised, or its chunk failed for good) or was cancelled."""

    id: str
    status: str            #: FAILED or CANCELLED
    error: str             #: the exception's type name ("Cancelled" for a cancelled item)
    message: str
    traceback: str = ""
    worker: str | None = None
    attempts: int | None = None   #: set when execute() itself raised
    chunk: str | None = None      #: set when the item's whole chunk failed

    @classmethod
    def of_chunk(cls, item_id: str, exc: BaseException | None, chunk: str) -> Failure:
        return cls(item_id, FAILED, type(exc).__name__, str(exc), chunk=chunk)

    @classmethod
    def cancelled(cls, item_id: str) -> Failure:
        return cls(item_id, CANCELLED, "Cancelled", "the run was interrupted (Ctrl-C) before this item finished")


Record = Ready | Failure


def encode(record: Record) -> str:
    """One JSON line (no newline), ``id`` first; a failure's unset ``attempts``/``chunk`` are left
    out. A result JSON cannot hold raises TypeError (the item then fails); a failure never does."""
    if isinstance(record, Ready):
        return json.dumps(asdict(record))
    data = {k: v for k, v in asdict(record).items() if v is not None or k not in ("attempts", "chunk")}
    return json.dumps(data, default=str)


def decode(line: bytes | str) -> Record:
    """The record a line holds: a failure has a ``status``."""
    data = json.loads(line)
    return Failure(**data) if "status" in data else Ready(**data)
