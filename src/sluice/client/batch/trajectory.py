"""``--traj``: the run's results as a Lance dataset beside the sink, for analysis and training.

``ready.ndjson`` stays the durable record (it survives kill -9 and drives resume); the Lance
dataset ``results.lance`` is rebuilt from it at the end of every run, resumed runs included, so
it always holds every success once. Rows: ``id``, ``worker``, ``attempts``, ``started`` (unix
seconds), ``seconds`` and ``result``, the execute() dict as JSON text (results need not share a
schema). It is streamed in batches, so memory stays flat for millions of rows.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sluice.client.batch.sink import READY
from sluice.errors import ConfigurationError
from sluice.tasks.batch.records import Ready, decode

DATASET = "results.lance"
BATCH_ROWS = 50_000


def require_lance() -> None:
    """Fail before the run starts when pylance is missing, not after it ends."""
    if importlib.util.find_spec("lance") is None or importlib.util.find_spec("pyarrow") is None:
        raise ConfigurationError(
            "--traj writes a Lance dataset and needs the pylance package: "
            "pip install 'sluice[traj]' (or pip install pylance)"
        )


def write_trajectory(sink_dir: Path) -> tuple[Path, int]:
    """(Re)write ``sink_dir/results.lance`` from ``ready.ndjson``; returns its path and row count."""
    os.environ.setdefault("LANCE_LOG", "error")  # its Rust logger warns that a first write creates the dataset
    import lance
    import pyarrow as pa

    schema = pa.schema(
        [
            ("id", pa.string()),
            ("worker", pa.string()),
            ("attempts", pa.int64()),
            ("started", pa.float64()),
            ("seconds", pa.float64()),
            ("result", pa.string()),
        ]
    )
    rows = 0

    def batches() -> Iterator[Any]:
        nonlocal rows
        for chunk in _records(sink_dir / READY):
            rows += len(chunk)
            yield pa.RecordBatch.from_pylist(chunk, schema=schema)

    target = sink_dir / DATASET
    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), str(target), mode="overwrite")
    return target, rows


def _records(path: Path) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    if not path.exists():
        return
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            record = decode(line)  # ready.ndjson holds successes only
            assert isinstance(record, Ready), f"{path} holds a failure record: {line[:200]}"
            chunk.append(
                {
                    "id": record.id,
                    "worker": record.worker,
                    "attempts": record.attempts,
                    "started": record.started,
                    "seconds": record.seconds,
                    "result": json.dumps(record.result),
                }
            )
            if len(chunk) >= BATCH_ROWS:
                yield chunk
                chunk = []
    if chunk:
        yield chunk
