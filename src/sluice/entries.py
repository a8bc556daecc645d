"""Reading many entries of a Redis structure at once (a hash, a list, a key scan), each on its own.

One entry that does not decode (a byte that is not UTF-8, a truncated write, another program's
data under a sluice key) is skipped, logged and counted, and the others are read: one bad entry
never stops orphan recovery, ``sluice status``, the metrics or the autoscaler. What to do with
the bad entry itself is the reader's business (the reaper, say, dead-letters a held message it
cannot read); here it is only set apart.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

log = logging.getLogger("sluice.entries")

E = TypeVar("E")
T = TypeVar("T")
D = TypeVar("D")

#: What a decoder raises on an entry it cannot read (UnicodeDecodeError and JSONDecodeError are
#: ValueErrors; the rest come from JSON of the wrong shape; RecursionError from nesting too deep).
UNREADABLE = (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError)

#: Entries skipped by this process since it started, by what they were meant to be (reported by
#: ``sluice_unreadable_entries_total`` in the metrics).
skipped: Counter[str] = Counter()

#: A kind's skips are logged at most this often (a sweep reads the same bad entry every second).
LOG_EVERY = 60.0
_logged: dict[str, float] = {}
_lock = threading.Lock()


def loads(raw: bytes | str) -> Any:
    """JSON from an entry whose bytes must be UTF-8, strictly: ``json.loads`` on bytes lets
    encoded surrogates through (``surrogatepass``), and a string holding one cannot name a Redis
    key or travel as a header later. The fetch script checks messages the same way."""
    return json.loads(raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw)


def text(raw: bytes | str) -> str:
    """An entry as a string, its bytes strictly UTF-8. redis-py's types say a reply holds
    ``bytes | str``; sluice's clients, which never decode responses, give bytes."""
    return raw.decode() if isinstance(raw, bytes) else raw


def blob(raw: bytes | str) -> bytes:
    """An entry's bytes, as sluice's clients (which never decode responses) return them; a
    string, from a client that does, is a ``TypeError`` (an entry that cannot be read)."""
    if isinstance(raw, str):
        raise TypeError(f"expected bytes from Redis, got a string: {raw[:60]!r} (a client decoding responses?)")
    return raw


def decode_one(what: str, entry: E, decode: Callable[[E], T], default: D) -> T | D:
    """``decode(entry)``, or ``default`` (logged and counted as ``what``) if it cannot be read."""
    try:
        return decode(entry)
    except UNREADABLE as exc:
        _skip(what, entry, exc)
        return default


def split(what: str, entries: Iterable[E], decode: Callable[[E], T]) -> tuple[list[T], list[tuple[E, Exception]]]:
    """Every entry decoded, and apart the ones that could not be (each with why), logged and counted."""
    good: list[T] = []
    bad: list[tuple[E, Exception]] = []
    for entry in entries:
        try:
            good.append(decode(entry))
        except UNREADABLE as exc:
            _skip(what, entry, exc)
            bad.append((entry, exc))
    return good, bad


def decode_each(what: str, entries: Iterable[E], decode: Callable[[E], T]) -> list[T]:
    """Every entry that decodes; the others are skipped, logged and counted as ``what``."""
    return split(what, entries, decode)[0]


def _skip(what: str, entry: object, exc: BaseException) -> None:
    now = time.monotonic()
    with _lock:
        skipped[what] += 1
        due = now - _logged.get(what, -LOG_EVERY) >= LOG_EVERY
        if due:
            _logged[what] = now
    if due:
        log.warning(
            "skipped an unreadable %s (%s: %s): %.120r; %d skipped by this process so far, logged at most every %.0fs",
            what,
            type(exc).__name__,
            exc,
            entry,
            skipped[what],
            LOG_EVERY,
        )
