"""Test app for learned memory: the app default (1Gi) fits only the big class (2Gi); the small
class (400Mi) holds what these tasks really use. Not ``shared`` (see tests/apps/admission.py)."""

from __future__ import annotations

import time
from typing import Any

from sluice import App, Compute, ComputeEscalation, ResourceClass, RetryOn, RetryPolicy
from sluice.headers import Headers

CLASSES = [ResourceClass("small", Compute(cpu="1", memory="400Mi"), slots=2),
           ResourceClass("big", Compute(cpu="1", memory="2Gi"), slots=1)]
DEFAULT = Compute(cpu="1", memory="1Gi")

app = App("tests.apps.learning", default_compute=DEFAULT, classes=CLASSES)


def _hold(mib: int, seconds: float) -> None:
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(seconds)


def _where(task: Any) -> dict[str, Any]:
    compute = Headers.read(task.request).compute
    where = {"queue": task.request.delivery_info.get("routing_key"),
             "memory": compute.memory_bytes if compute else None}
    app.redis.rpush(f"test:ran:{task.request.id}", where["queue"])
    return where


@app.task(bind=True, shared=False, compute=Compute(memory="auto"))
def hundred(self: Any) -> dict[str, Any]:
    """About 100MiB for half a second."""
    where = _where(self)
    _hold(100, 0.5)
    return where


@app.task(bind=True, shared=False, compute=Compute(memory="auto"),
          retry=RetryPolicy(max_retries=4, retry_on=RetryOn.OOM, escalate=ComputeEscalation(factor=2.0,
                                                                                           max_memory="2Gi")))
def varies(self: Any, mib: int) -> dict[str, Any]:
    """``mib`` MiB for half a second: learned small, then asked for more than it learned."""
    where = _where(self)
    _hold(mib, 0.5)
    return where
