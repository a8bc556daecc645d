"""The records of a batch run, one per item: the one schema, one encoder and one decoder.

A worker encodes each record once; the same line goes to the run's result cache (a Redis hash),
to the driver (the ``ready`` list) and, through the driver, to the sink (``ready.ndjson`` or
``failures.ndjson``). ``id`` is always the first key (every line starts with ``ID_PREFIX``), so
resume can read a million ids by slicing them out of lines instead of parsing them; a test pins that.
"""

from __future__ import annotations

import json
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

#: How an item that has no result ended: execute() failed (resume skips it); the run was
#: interrupted (resume runs it again); its chunk was lost for good to infrastructure, a worker
#: or a driver that died (resume runs it again: it is not the item's fault).
FAILED, CANCELLED, LOST = "failed", "cancelled", "lost"
#: The statuses resume runs again.
RERUN = (CANCELLED, LOST)
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
    status: str  #: FAILED, CANCELLED or LOST
    error: str  #: the exception's type name ("Cancelled" for a cancelled item)
    message: str
    traceback: str = ""
    worker: str | None = None
    attempts: int | None = None  #: set when execute() itself raised
    chunk: str | None = None  #: set when the item's whole chunk failed

    @classmethod
    def of_chunk(cls, item_id: str, exc: BaseException | None, chunk: str) -> Failure:
        """The item's whole chunk failed for good (its worker died, retries spent): LOST."""
        return cls(item_id, LOST, type(exc).__name__, str(exc), chunk=chunk)

    @classmethod
    def cancelled(cls, item_id: str) -> Failure:
        return cls(item_id, CANCELLED, "Cancelled", "the run was interrupted (Ctrl-C) before this item finished")


Record = Ready | Failure


def encode(record: Record) -> str:
    """One JSON line (no newline), ``id`` first; a failure's unset ``attempts``/``chunk`` are left
    out. A result JSON cannot hold (an object, a NaN or an infinity) raises TypeError or a
    ValueError naming the field (the item then fails); a failure never does."""
    if isinstance(record, Ready):
        try:
            return json.dumps(asdict(record), allow_nan=False)
        except ValueError:
            raise ValueError(
                f"{_non_finite(record.result, 'result')}: JSON has no NaN or infinity; return None or a string instead"
            ) from None
    data = {k: v for k, v in asdict(record).items() if v is not None or k not in ("attempts", "chunk")}
    return json.dumps(data, default=str)


def execute_item(
    execute: Callable[[dict[str, Any]], Any], item: dict[str, Any], worker: str, attempt: int
) -> tuple[str, str]:
    """(id, the encoded record): what ``execute(item)`` returned, or how it failed. A worker and
    ``sluice compute --check`` both run items through this, so a result the sink cannot hold
    fails under ``--check`` exactly as it fails in a real run."""
    started = time.time()
    try:
        result = execute(item)
        return item["id"], encode(Ready(item["id"], result, worker, attempt, started, round(time.time() - started, 6)))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - sys.exit() or a result JSON cannot hold fails this item alone
        message = str(exc) if isinstance(exc, Exception) else f"execute() raised {exc!r} for item {item['id']!r}"
        return item["id"], encode(
            Failure(item["id"], FAILED, type(exc).__name__, message, traceback.format_exc(), worker, attempt)
        )


def _non_finite(value: Any, path: str) -> str:
    """Where in ``value`` the first NaN or infinity is, e.g. ``result["loss"] is nan``."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path} is {value!r}"
    children = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    )
    for key, child in children:
        found = _non_finite(child, f"{path}[{key!r}]")
        if found:
            return found
    return ""


def decode(line: bytes | str) -> Record:
    """The record a line holds: a failure has a ``status``. ValueError or TypeError if the line
    holds none."""
    data = json.loads(line)
    if not isinstance(data, dict) or not isinstance(data.get("id"), str):
        raise TypeError("a record is a JSON object with a string id")
    return Failure(**data) if "status" in data else Ready(**data)
