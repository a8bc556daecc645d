"""Test app for cluster-wide limits: unique tasks, rate and concurrency limits."""

from __future__ import annotations

from typing import Any

from sluice import App, Limit, Unique

app = App("tests.apps.limits")
#: Each run of ``order`` pushes its id here: how many times a body ran.
RUNS = "test:limits-runs"


@app.task(bind=True, unique=Unique(key="order_id", ttl=60))
def order(self: Any, order_id: str, amount: int = 1) -> str:
    """Charged once per order id however often it is sent."""
    self.app.redis.rpush(RUNS, order_id)
    return order_id


@app.task
def ping(value: str) -> str:
    """Not unique: every call runs."""
    app.redis.rpush(RUNS, value)
    return value


@app.task(bind=True, max_running=2)
def scarce(self: Any, label: str, seconds: float) -> str:
    """At most two run at once across the cluster; records its start, then sleeps."""
    import time

    self.app.redis.rpush(RUNS, label)
    time.sleep(seconds)
    return label


@app.task(max_running=Limit(running=1, key="customer"))
def per_customer(customer: str, n: int) -> str:
    """At most one at once per customer."""
    return f"{customer}-{n}"


#: Each run of ``metered`` and ``metered_per_customer`` pushes "<label> <start time>" here.
STARTS = "test:limits-starts"


@app.task(rate_limit="20/s")
def metered(label: str) -> None:
    """At most 20 started per second across the cluster; records when its body started."""
    import time

    app.redis.rpush(STARTS, f"{label} {time.time()!r}")


@app.task(rate_limit=Limit("4/s", key="customer"))
def metered_per_customer(customer: str, n: int) -> None:
    """At most 4 started per second per customer; records when its body started."""
    import time

    app.redis.rpush(STARTS, f"{customer} {time.time()!r}")
