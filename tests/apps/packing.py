"""Test app for packed workers: one packed class of 2Gi (up to 8 tasks at once); tasks that
record when they ran, at what size. Not ``shared`` (see tests/apps/admission.py)."""

from __future__ import annotations

import json
import time
from typing import Any

from sluice import App, Compute, ResourceClass

CLASSES = [ResourceClass("packed", Compute(cpu="8", memory="2Gi"), slots=8, pack=True)]

app = App("tests.apps.packing", default_compute=Compute(cpu="1", memory="200Mi"), classes=CLASSES)


def _span(task: Any, memory: int, seconds: float) -> None:
    start = time.time()
    time.sleep(seconds)
    app.redis.rpush("test:spans", json.dumps({"id": task.request.id, "start": start, "end": time.time(),
                                              "memory": memory}))


@app.task(bind=True, shared=False)
def small(self: Any, seconds: float) -> None:
    """200Mi (the default compute)."""
    _span(self, 200 << 20, seconds)


@app.task(bind=True, shared=False, compute=Compute(memory="1536Mi"))
def big(self: Any, seconds: float) -> None:
    _span(self, 1536 << 20, seconds)
