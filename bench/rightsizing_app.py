"""The app bench/rightsizing.py runs, in one of three modes (``BENCH_RIGHTSIZING_MODE``):
``fixed`` (slots of the largest declared size), ``packed`` (one packed class, declared sizes) and
``learned`` (the same packed class, ``memory="auto"``). One task per real peak (its process's
RSS, the worker child's own ~70Mi included, as the watchdog measures it); each declares about
twice its peak, rounded up to a power of two, as users do."""

from __future__ import annotations

import os
import time
from typing import Any

import psutil

from sluice import App, Compute, ResourceClass
from sluice.tasks.escalation import Attempt

MODE = os.environ.get("BENCH_RIGHTSIZING_MODE", "fixed")
WORKER = Compute(cpu="16", memory="8Gi")
#: each task's real peak in MiB -> the memory it declares
SIZES = {100: "256Mi", 180: "512Mi", 320: "1Gi", 560: "2Gi", 1000: "2Gi"}


def classes(mode: str = MODE) -> list[ResourceClass]:
    if mode == "fixed":   # a slot must hold the largest declaration: 2Gi, four to the 8Gi worker
        return [ResourceClass("work", Compute(cpu="4", memory="2Gi"), slots=4)]
    return [ResourceClass("work", WORKER, slots=16, pack=True)]


app = App("bench.rightsizing", default_compute=Compute(cpu="1", memory="2Gi"), classes=classes())


def _body(task: Any, mib: int, seconds: float) -> dict[str, Any]:
    started = time.time()
    block = bytearray(max(0, (mib << 20) - psutil.Process().memory_info().rss))   # up to a peak of mib
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(max(0.0, started + seconds - time.time()))   # `seconds` of work in all, touching the memory included
    reserved = Attempt.of(task, task.request, task.request.delivery_info).compute.memory_bytes
    return {"reserved": reserved, "peak": psutil.Process().memory_info().rss, "start": started, "end": time.time()}


def _declare(mib: int, memory: str) -> None:
    compute = Compute(memory="auto" if MODE == "learned" else memory)

    @app.task(bind=True, name=f"bench.rightsizing.use_{mib}", compute=compute, shared=False)
    def use(self: Any, seconds: float) -> dict[str, Any]:
        return _body(self, mib, seconds)


for _mib, _memory in SIZES.items():
    _declare(_mib, _memory)
