"""Test app for task metrics: tasks that succeed, fail, and retry once."""

from __future__ import annotations

from typing import Any

from sluice import App

app = App("tests.apps.observed")


@app.task
def ok(x: int) -> int:
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
