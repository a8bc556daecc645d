"""Test app on the default catalog (cpu 2Gi, highmem 64Gi, gpu): routing and the watchdog."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from sluice import App, Compute

app = App("tests.apps.basic")

MiB = 1 << 20


def _where(task: Any) -> dict[str, Any]:
    return {"queue": task.request.delivery_info.get("routing_key"), "worker": task.request.hostname,
            "pid": os.getpid()}


@app.task(bind=True)
def default_task(self: Any) -> dict[str, Any]:
    return _where(self)


@app.task(bind=True, compute=Compute(memory="4Gi"))
def big_task(self: Any) -> dict[str, Any]:
    return _where(self)


@app.task(bind=True, compute=Compute(memory="200Mi"))
def hog(self: Any, mib: int, hold: float = 5.0) -> dict[str, Any]:
    """Touches ``mib`` MiB (really resident), then holds it."""
    block = bytearray(mib * MiB)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(hold)
    return {"held": len(block), **_where(self)}


@app.task(bind=True, compute=Compute(memory="200Mi"))
def sleeper(self: Any, seconds: float) -> dict[str, Any]:
    time.sleep(seconds)
    return _where(self)


@app.task
def double(x: int) -> int:
    """2x; a negative x raises ValueError (a failed call among many)."""
    if x < 0:
        raise ValueError(f"negative: {x}")
    return 2 * x


@app.task(result_args=False)
def bulky(data: list[int]) -> int:
    """A task whose argument is bulk data: its stored state leaves it out."""
    return len(data)


@app.task(track_started=False)
def untracked(x: int) -> int:
    """No STARTED state is stored for it: its ledger claim is made on its own."""
    return x


@app.task
def freeze_worker_then_return(key: str) -> str:
    """Counts its run in ``key``, then stops (SIGSTOP) the worker's main process: the result is
    stored by this pool process, while the worker can no longer acknowledge the message."""
    app.redis.incr(key)
    os.kill(os.getppid(), signal.SIGSTOP)
    return "done"
