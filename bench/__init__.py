"""Benchmarks: each script measures one goal and prints one JSON line of figures."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def private_broker() -> Iterator[dict[str, str]]:
    """A redis-server of the run's own, in a temporary directory: this process's apps (created
    from here on) use it, and the environment yielded points the workers it starts at it."""
    from sluice.deploy.embedded import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp)) as server:
        os.environ["SLUICE_BROKER_URL"] = server.url
        yield os.environ | {"PYTHONPATH": str(ROOT)}
