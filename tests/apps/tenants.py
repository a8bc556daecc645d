"""Test app for tenants: the default ladder, its cpu class shared by weights and a quota."""

from __future__ import annotations

import time
from typing import Any

from sluice import App, Compute, Share
from sluice.queues.catalog import Catalog

#: Each task pushes its label here as it starts: the order the fetch chose.
STARTS = "test:tenant-starts"

CLASSES = Catalog.merged({"cpu": {"tenants": {
    "light": Share(weight=1),
    "heavy": Share(weight=3),
    "capped": Share(quota=Compute(cpu="1")),
}}})
app = App("tests.apps.tenants", classes=list(CLASSES))


@app.task(bind=True)
def nap(self: Any, label: str, seconds: float) -> str:
    """Records its start under ``label``, then sleeps ``seconds``."""
    self.app.redis.rpush(STARTS, label)
    time.sleep(seconds)
    return label


@app.task(bind=True, compute=Compute(memory="200Mi"))
def hog(self: Any, label: str, mib: int, hold: float) -> str:
    """Records its start, touches ``mib`` MiB (really resident), then holds it ``hold`` seconds."""
    self.app.redis.rpush(STARTS, label)
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(hold)
    return label
