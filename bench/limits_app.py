"""The apps bench/limits.py runs: a sluice App with a rate-limited task (50/s across the
cluster), a keyed one and an unlimited no-op, and stock Celery with the same rate_limit="50/s"
(Celery's meaning: each worker keeps it for itself), on the same Redis."""

from __future__ import annotations

import time

from celery import Celery

from sluice import App, Limit

app = App("bench.limits")
RATE = 50


@app.task(name="bench.limits.metered", rate_limit=f"{RATE}/s", shared=False)
def metered() -> float:
    """Returns when its body started (wall clock)."""
    return time.time()


@app.task(name="bench.limits.keyed", rate_limit=Limit(f"{RATE // 2}/s", key="customer"))
def keyed(customer: str) -> float:
    """Returns when its body started; each customer has its own rate."""
    return time.time()


@app.task(name="bench.limits.free")
def free() -> None:
    """No limit: the work the limits must not slow down."""


plain_app = Celery("bench.limits.plain", broker=app.conf.broker_url, backend=app.conf.result_backend)


@plain_app.task(name="bench.limits.metered", rate_limit=f"{RATE}/s", shared=False)
def plain_metered() -> float:
    """The same task on stock Celery, its rate_limit kept by each worker."""
    return time.time()
