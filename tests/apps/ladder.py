"""Test app on a small ladder (small 150Mi, medium 300Mi, large 600Mi): escalation with real kills."""

from __future__ import annotations

import os
import time
from typing import Any

from sluice import (
    App,
    Backoff,
    Compute,
    ComputeEscalation,
    ResourceClass,
    RetryOn,
    RetryPolicy,
    Transient,
)
from sluice.headers import attempt_of

app = App("tests.apps.ladder", default_compute=Compute(cpu="1", memory="100Mi"), classes=[
    ResourceClass("small", Compute(cpu="1", memory="150Mi"), slots=2),
    ResourceClass("medium", Compute(cpu="1", memory="300Mi"), slots=2),
    ResourceClass("large", Compute(cpu="1", memory="600Mi"), slots=2),
])

MiB = 1 << 20
QUICK = Backoff(initial=0.2, factor=2.0, maximum=1.0)
ESCALATE = ComputeEscalation(factor=2.0, max_memory="600Mi")


def _attempt(task: Any) -> dict[str, Any]:
    """Count this execution in Redis and say where it ran."""
    app.redis.rpush(f"test:runs:{task.request.id}", task.request.delivery_info.get("routing_key"))
    return {"queue": task.request.delivery_info.get("routing_key"), "worker": task.request.hostname,
            "attempt": attempt_of(task.request)}


def _hold(mib: int, seconds: float) -> None:
    block = bytearray(mib * MiB)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(seconds)


@app.task(bind=True, compute=Compute(memory="150Mi"),
          retry=RetryPolicy(max_retries=3, retry_on=RetryOn.OOM, escalate=ESCALATE))
def grows(self: Any, mib: int) -> dict[str, Any]:
    where = _attempt(self)
    _hold(mib, 1.0)
    return where


@app.task(bind=True, compute=Compute(memory="150Mi"),
          retry=RetryPolicy(max_retries=5, retry_on=RetryOn.TRANSIENT, escalate=ESCALATE))
def always_too_big(self: Any) -> None:
    _attempt(self)
    _hold(700, 5.0)


@app.task(bind=True, retry=RetryPolicy(max_retries=3, retry_on=RetryOn.TRANSIENT, backoff=QUICK))
def business(self: Any) -> None:
    _attempt(self)
    raise ValueError("row 17 has no customer id")


@app.task(bind=True, compute=Compute(memory="150Mi"),
          retry=RetryPolicy(max_retries=3, retry_on=RetryOn.TRANSIENT, escalate=ESCALATE, backoff=QUICK))
def flaky(self: Any) -> dict[str, Any]:
    where = _attempt(self)
    if where["attempt"] == 1:
        raise Transient("the warehouse was busy")
    return where


@app.task(bind=True, retry=RetryPolicy(max_retries=2, retry_on=RetryOn.TRANSIENT, backoff=QUICK))
def poison_exit(self: Any) -> None:
    _attempt(self)
    os._exit(1)


@app.task(bind=True, compute=Compute(memory="150Mi"),
          retry=RetryPolicy(max_retries=3, retry_on=RetryOn.TRANSIENT, escalate=ESCALATE, backoff=QUICK))
def poison_kill(self: Any) -> None:
    _attempt(self)
    os.kill(os.getpid(), 9)


@app.task(bind=True, retry=RetryPolicy(max_retries=3, retry_on=RetryOn.TRANSIENT, escalate=ESCALATE))
def long_step(self: Any, seconds: float) -> dict[str, Any]:
    """Marks itself running (so a test can kill its worker mid-task), works; retries are quick."""
    where = _attempt(self)
    app.redis.set(f"test:running:{self.request.id}:{where['attempt']}", time.time())
    time.sleep(seconds if where["attempt"] == 1 else 0.1)
    app.redis.incr(f"test:completed:{self.request.id}")
    return where


@app.task(bind=True, compute=Compute(memory="150Mi"))
def no_policy_hog(self: Any) -> None:
    _attempt(self)
    _hold(300, 5.0)


@app.task(bind=True)
def unguarded_step(self: Any, seconds: float) -> None:
    """No retry policy: if its worker dies mid-task, the redelivery ends it failed, once."""
    where = _attempt(self)
    app.redis.set(f"test:running:{self.request.id}:{where['attempt']}", time.time())
    time.sleep(seconds)
