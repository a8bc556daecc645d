"""Test app for task metrics: tasks that succeed, fail, and retry once."""

from __future__ import annotations

import time
from typing import Any

from sluice import App

app = App("tests.apps.observed")


@app.task
def ok(x: int) -> int:
    """Runs long enough for the watchdog to measure its memory (it samples every 50 ms)."""
    time.sleep(0.2)
    return x


@app.task
def boom() -> None:
    raise ValueError("boom")


@app.task(bind=True, max_retries=1)
def flaky(self: Any) -> str:
    """Fails its first attempt into a Celery retry, then succeeds."""
    if not self.request.retries:
        raise self.retry(countdown=0)
    return "done"
