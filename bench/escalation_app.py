"""The app bench/escalation.py drives: three ways an attempt dies, each followed by a retry."""

from __future__ import annotations

import os
import time
from typing import Any

from sluice import App, Compute, ComputeEscalation, ResourceClass, RetryOn, RetryPolicy
from sluice.headers import attempt_of

app = App("bench.escalation", default_compute=Compute(cpu="1", memory="150Mi"), classes=[
    ResourceClass("small", Compute(cpu="1", memory="150Mi"), slots=2),
    ResourceClass("medium", Compute(cpu="1", memory="300Mi"), slots=2),
    ResourceClass("large", Compute(cpu="1", memory="600Mi"), slots=2),
])
POLICY = RetryPolicy(max_retries=2, retry_on=RetryOn.OOM, escalate=ComputeEscalation(factor=2.0, max_memory="600Mi"))


def _attempt(task: Any) -> int:
    """Record when this attempt started; return its number."""
    number = attempt_of(task.request)
    app.redis.set(f"bench:start:{task.request.id}:{number}", time.time())
    return number


@app.task(bind=True, retry=POLICY)
def hog(self: Any) -> None:
    """(a) the watchdog kills attempt 1 for memory."""
    if _attempt(self) == 1:
        block = bytearray(250 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(10)


@app.task(bind=True, retry=POLICY)
def sigkill(self: Any) -> None:
    """(b) something else SIGKILLs attempt 1's process (as the kernel OOM killer would)."""
    if _attempt(self) == 1:
        app.redis.set(f"bench:killed:{self.request.id}", time.time())
        os.kill(os.getpid(), 9)


@app.task(bind=True, retry=POLICY)
def steady(self: Any) -> None:
    """(c) attempt 1 runs until the harness kills its whole worker."""
    if _attempt(self) == 1:
        app.redis.set(f"bench:host:{self.request.id}", self.request.hostname)
        time.sleep(60)
