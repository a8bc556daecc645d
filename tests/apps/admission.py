"""Test app for routing and admission: a small ladder (small 150Mi, big 600Mi, gpu 600Mi + 1 gpu)
and tasks that record where they ran. Not ``shared``: another App in the test process must not
learn them, as a web app that never imported this module would not."""

from __future__ import annotations

import time
from typing import Any

from sluice import App, Compute, ComputeEscalation, ResourceClass, RetryOn, RetryPolicy

CLASSES = [ResourceClass("small", Compute(cpu="1", memory="150Mi"), slots=2),
           ResourceClass("big", Compute(cpu="1", memory="600Mi"), slots=2),
           ResourceClass("gpu", Compute(cpu="1", memory="600Mi", gpu=1), slots=1)]

app = App("tests.apps.admission", default_compute=Compute(cpu="1", memory="100Mi"), classes=CLASSES)


def _ran(task: Any) -> dict[str, Any]:
    """Count this execution in Redis and say where it ran."""
    where = {"queue": task.request.delivery_info.get("routing_key"), "worker": task.request.hostname}
    app.redis.rpush(f"test:ran:{task.request.id}", where["queue"])
    return where


@app.task(bind=True, shared=False)
def where(self: Any) -> dict[str, Any]:
    """The default compute (100Mi): the small class."""
    return _ran(self)


@app.task(bind=True, shared=False, compute=Compute(memory="400Mi"))
def wide(self: Any, seconds: float = 0.0) -> dict[str, Any]:
    """400Mi: only the big class holds it."""
    found = _ran(self)
    time.sleep(seconds)
    return found


@app.task(bind=True, shared=False, compute=Compute(memory="300Mi", gpu=1))
def train(self: Any) -> dict[str, Any]:
    return _ran(self)


@app.task(bind=True, shared=False, compute=Compute(memory="140Mi"),
          retry=RetryPolicy(max_retries=2, retry_on=RetryOn.OOM, escalate=ComputeEscalation(factor=2.0,
                                                                                           max_memory="600Mi")))
def grows(self: Any, mib: int) -> dict[str, Any]:
    """Holds ``mib`` MiB for a second: killed for memory at 140Mi, it escalates to 280Mi (big)."""
    found = _ran(self)
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(1.0)
    return found
