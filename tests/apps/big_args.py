"""Test app for tasks with big arguments and big results (tests/test_big_args.py)."""

from __future__ import annotations

import time
from typing import Any

from sluice import App

app = App("tests.apps.big_args")


@app.task
def measure(data: str) -> int:
    """The length of its (big) argument: a small result for a big call."""
    return len(data)


@app.task
def blob(size: int) -> str:
    """A return value of ``size`` characters: a big result for a small call."""
    return "r" * size


@app.task(bind=True)
def report_then_hold(self: Any, key: str, size: int, timeout: float) -> str:
    """Stores a progress state of ``size`` characters, then runs until ``key`` exists in Redis
    (at most ``timeout`` seconds), looking every 10 ms."""
    self.update_state(state="PROGRESS", meta={"progress": "p" * size})
    deadline = time.monotonic() + timeout
    while not app.redis.exists(key) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "held"
