"""The app bench/fairness.py runs: the default ladder, its cpu class (4 slots a worker) shared
by tenants a (weight 1), b (weight 3) and capped (a quota of one slot)."""

from __future__ import annotations

import time

from sluice import App, Compute, Share
from sluice.queues.catalog import Catalog

app = App("bench.fairness", classes=list(Catalog.merged({"cpu": {"tenants": {
    "a": Share(weight=1),
    "b": Share(weight=3),
    "capped": Share(quota=Compute(cpu="1")),
}}})))


@app.task(name="bench.fairness.work")
def work(seconds: float) -> tuple[float, float]:
    """Sleeps ``seconds``; returns when it started and ended (wall clock)."""
    start = time.time()
    if seconds:
        time.sleep(seconds)
    return start, time.time()
