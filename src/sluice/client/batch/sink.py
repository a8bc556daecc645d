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

from sluice.client.batch.records import FAILED, ID_PREFIX, Ready, Record, decode, encode

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


def _ids(path: Path, status: str | None = None) -> Iterable[str]:
    """Ids recorded in an ndjson file. Every line starts with ``ID_PREFIX`` (records.encode puts
    the id first), so the id is sliced out of each line without parsing it; an id holding an
    escape (or a block with a line that does not start that way) is parsed."""
    if not path.exists():
        return
    start = len(ID_PREFIX)
    for block in _blocks(path):
        text = block.decode("utf-8")
        lines = text.splitlines()
        if status is None and text.count("\n" + ID_PREFIX) + text.startswith(ID_PREFIX) == len(lines):
            ids = [line[start:line.find('"', start)] for line in lines]
            if "\\" in text:  # only then can an id hold an escape
                ids = [decode(line).id if "\\" in item else item for line, item in zip(lines, ids)]
            yield from ids
            continue
        for line in lines:
            record = decode(line)
            if status is None or getattr(record, "status", None) == status:
                yield record.id


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
        """Ids resume skips: every success, and failures unless re-running them (cancelled ids run again)."""
        done = set(_ids(self.directory / READY))
        if not rerun_failed:
            done.update(_ids(self.directory / FAILURES, status=FAILED))
        return done

    def write(self, records: Iterable[Record]) -> None:
        """Append records (successes to ready.ndjson, failures to failures.ndjson) and flush."""
        ready, failures = [], []
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
        for handle in (self._ready, self._failures):
            if handle is not None:
                handle.flush()
                os.fsync(handle.fileno())
                handle.close()
