"""The durable sink of a batch run: ``ready.ndjson``, ``failures.ndjson``, ``checkpoint.json``.

Lines are appended and flushed as results arrive, so a ``kill -9`` at any moment leaves at most
one torn trailing line per file; :meth:`Sink.open` finds and cuts it before anything else is
written. The checkpoint is replaced atomically (write a temporary file, then rename).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sluice.tasks.batch.records import (
    FAILED,
    ID_PREFIX,
    Failure,
    Ready,
    Record,
    decode,
    encode,
)

READY, FAILURES, CHECKPOINT = "ready.ndjson", "failures.ndjson", "checkpoint.json"


def repair_torn_tail(path: Path) -> bool:
    """Cut a trailing partial line (no newline, or not JSON) left by a crash; True if one was cut."""
    if not path.exists() or path.stat().st_size == 0:
        return False
    with open(path, "rb+") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        tail_start = max(0, size - (1 << 20))
        handle.seek(tail_start)
        tail = handle.read()
        if tail.endswith(b"\n"):
            last = tail[:-1].rsplit(b"\n", 1)[-1]
            try:
                json.loads(last)
                return False
            except ValueError:
                cut = size - len(last) - 1
        else:
            cut = tail_start + tail.rfind(b"\n") + 1
        handle.truncate(cut)
        return True


_BLOCK = 64 << 20


def _blocks(path: Path) -> Iterable[bytes]:
    """The file in blocks of whole lines (bounded memory for a sink of any size)."""
    with open(path, "rb") as handle:
        rest = b""
        while block := handle.read(_BLOCK):
            block = rest + block
            cut = block.rfind(b"\n") + 1
            rest = block[cut:]
            yield block[:cut]
        if rest:
            yield rest


def _ids(path: Path) -> Iterable[str]:
    """Ids recorded in an ndjson file. Every line starts with ``ID_PREFIX`` (records.encode puts
    the id first), so the id is sliced out of each line without parsing it; an id holding an
    escape (or a block with a line that does not start that way) is parsed."""
    if not path.exists():
        return
    start = len(ID_PREFIX)
    for block in _blocks(path):
        text = block.decode("utf-8")
        lines = text.splitlines()
        if text.count("\n" + ID_PREFIX) + text.startswith(ID_PREFIX) == len(lines):
            ids = [line[start : line.find('"', start)] for line in lines]
            if "\\" in text:  # only then can an id hold an escape
                ids = [decode(line).id if "\\" in item else item for line, item in zip(lines, ids)]
            yield from ids
            continue
        yield from (decode(line).id for line in lines)


def _latest_failures(path: Path) -> dict[str, tuple[str, str]]:
    """Per id, its latest failure record in ``path``: id -> (status, line), oldest first."""
    latest: dict[str, tuple[str, str]] = {}
    if not path.exists():
        return latest
    for block in _blocks(path):
        for line in block.decode("utf-8").splitlines():
            record = decode(line)
            assert isinstance(record, Failure), f"{path} holds a success record: {line[:200]}"
            latest.pop(record.id, None)
            latest[record.id] = (record.status, line)
    return latest


@dataclass
class Sink:
    """Append-only writers for one sink directory."""

    directory: Path
    repaired: list[str] = field(default_factory=list)
    _ready: IO[str] | None = None
    _failures: IO[str] | None = None

    def open(self) -> Sink:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.repaired = [name for name in (READY, FAILURES) if repair_torn_tail(self.directory / name)]
        self._ready = open(self.directory / READY, "a", encoding="utf-8")
        self._failures = open(self.directory / FAILURES, "a", encoding="utf-8")
        return self

    def done_ids(self, rerun_failed: bool = False) -> set[str]:
        """Ids resume skips: every success, and ids whose latest record is a failure unless
        re-running them (cancelled and lost ids run again)."""
        done = set(_ids(self.directory / READY))
        if not rerun_failed:
            done.update(i for i, (status, _) in _latest_failures(self.directory / FAILURES).items() if status == FAILED)
        return done

    def write(self, records: Iterable[Record]) -> None:
        """Append records (successes to ready.ndjson, failures to failures.ndjson) and flush."""
        ready: list[str] = []
        failures: list[str] = []
        for record in records:
            (ready if isinstance(record, Ready) else failures).append(encode(record) + "\n")
        for handle, lines in ((self._ready, ready), (self._failures, failures)):
            if lines and handle is not None:
                handle.write("".join(lines))
                handle.flush()

    def checkpoint(self, data: dict[str, Any]) -> None:
        target = self.directory / CHECKPOINT
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str))
        os.replace(tmp, target)

    def close(self) -> None:
        """Flush and sync both files, then compact failures.ndjson (see :meth:`compact_failures`)."""
        for handle in (self._ready, self._failures):
            if handle is not None:
                handle.flush()
                os.fsync(handle.fileno())
                handle.close()
        self._ready = self._failures = None
        self.compact_failures()

    def compact_failures(self) -> int:
        """Make failures.ndjson tell the truth now: per id only its latest record, and no id that
        has since succeeded (a resume ran it again). Replaced atomically; returns the lines dropped."""
        path = self.directory / FAILURES
        if not path.exists() or path.stat().st_size == 0:
            return 0
        latest = _latest_failures(path)
        succeeded = set(_ids(self.directory / READY))
        kept = [line for item_id, (_, line) in latest.items() if item_id not in succeeded]
        total = sum(block.count(b"\n") for block in _blocks(path))
        if len(kept) == total:
            return 0
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in kept))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        return total - len(kept)
