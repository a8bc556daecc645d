"""Test app for tests/test_promises.py, on the default catalog (cpu 2Gi, highmem 64Gi, gpu).

Each task records its runs at the source (a Redis list per task id), so a test counts
executions of the body, not results. Not ``shared``: another App in the test process must not
learn them.

With ``PROMISES_BLOCK_LINK`` set in a worker's environment, that worker blocks in Celery's
``before_task_publish`` for :func:`after_window`: Celery publishes a task's link callbacks after
its body has returned and before its result is stored, so a task linked to ``after_window``
stops exactly in the at-least-once window the README names, and a test can kill the worker
there. The receiver is connected only in such a worker (a receiver anywhere makes
``delay_many`` fall back to ``apply_async``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import signals

from sluice import App, Backoff, RetryOn, RetryPolicy
from sluice.headers import attempt_of

app = App("tests.apps.promises")

QUICK = Backoff(initial=0.2, factor=2.0, maximum=1.0)
AGAIN = RetryPolicy(max_retries=3, retry_on=RetryOn.TRANSIENT, backoff=QUICK)
#: How long a test task waits for its release at most (a bound, never reached in a passing test).
HOLD_LIMIT = 120.0


def runs_key(task_id: str) -> str:
    return f"test:promises:runs:{task_id}"


def _ran(task: Any) -> dict[str, Any]:
    """Count this execution (worker and attempt) in Redis and say where it ran."""
    where = {"worker": task.request.hostname, "attempt": attempt_of(task.request),
             "queue": (task.request.delivery_info or {}).get("routing_key")}
    app.redis.rpush(runs_key(task.request.id), f"{where['worker']} {where['attempt']}")
    return where


def _wait_for_file(path: str) -> None:
    deadline = time.monotonic() + HOLD_LIMIT
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


@app.task(bind=True, shared=False)
def touch(self: Any, path: str, payload: Any = None) -> dict[str, Any]:
    """Creates ``path``: proof the task ran."""
    Path(path).write_text("ran")
    return _ran(self)


@app.task(bind=True, shared=False)
def hold(self: Any, release: str) -> dict[str, Any]:
    """Counts its run, then holds its slot until the file ``release`` exists."""
    where = _ran(self)
    _wait_for_file(release)
    return where


@app.task(bind=True, shared=False, retry=AGAIN)
def hold_again(self: Any, release: str) -> dict[str, Any]:
    """``hold`` with a TRANSIENT retry policy: a lost attempt runs again. Only attempt 1 waits."""
    where = _ran(self)
    if where["attempt"] == 1:
        _wait_for_file(release)
    return where


@app.task(bind=True, shared=False, retry=AGAIN)
def returns_then_links(self: Any) -> dict[str, Any]:
    """Counts its run and returns at once; link it to :func:`after_window` to stop in the window."""
    return _ran(self)


@app.task(shared=False)
def after_window() -> str:
    return "after"


def reached_key(task_id: str) -> str:
    return f"test:promises:window:{task_id}"


def _block_in_window(sender: Any = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
    """The link of a task whose body returned is being published: its result is not stored yet.
    Say so in Redis (under the parent's id), then wait to be killed."""
    if sender != after_window.name:
        return
    parent = (headers or {}).get("parent_id")
    app.redis.set(reached_key(str(parent)), os.getpid())
    time.sleep(HOLD_LIMIT)


if os.environ.get("PROMISES_BLOCK_LINK"):
    signals.before_task_publish.connect(_block_in_window, weak=False)
