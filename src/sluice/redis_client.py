"""The one way sluice connects to Redis for its own state (ledger, heartbeats, runs, catalog).

A Redis that restarts (a pod rescheduled, an AOF reload) is unreachable for seconds. Every
command on a client from :func:`connect` retries connection and timeout errors with
exponential backoff for about :data:`OUTAGE_WAIT` seconds before it raises, so a blink is waited
out instead of failing whatever was running; Celery's publishing and result backend are told
the same (see :func:`retry_settings`). Past that bound the error surfaces, as
:class:`redis.ConnectionError` (kombu's ``OperationalError`` from a publish).
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry

#: Backoff between attempts: doubling from 0.1 s, at most 5 s.
BACKOFF_BASE, BACKOFF_CAP = 0.1, 5.0
#: Retries of one command: 0.2 + 0.4 + ... then 5 s each, about two minutes in all.
OUTAGE_RETRIES = 28
#: How long one command waits for an unreachable Redis before it raises (seconds, ~117).
OUTAGE_WAIT = sum(min(BACKOFF_CAP, BACKOFF_BASE * 2 ** i) for i in range(1, OUTAGE_RETRIES + 1))


def outage_retry() -> Retry:
    """redis-py's retry policy for sluice's clients (a new object per client: it holds state)."""
    return Retry(ExponentialBackoff(cap=BACKOFF_CAP, base=BACKOFF_BASE), OUTAGE_RETRIES,
                 supported_errors=(ConnectionError, TimeoutError))


def connect(url: str, *, wait_out_outages: bool = True, **kwargs: Any) -> redis.Redis:
    """A client on ``url`` that waits out a Redis outage (see the module docstring); with
    ``wait_out_outages=False`` one that fails at once (a command line reading figures)."""
    if not wait_out_outages:
        return redis.Redis.from_url(url, retry=Retry(ExponentialBackoff(), 0), **kwargs)
    return redis.Redis.from_url(url, retry=outage_retry(), retry_on_error=[ConnectionError, TimeoutError],
                                **kwargs)


def publish_retry_policy() -> dict[str, float]:
    """Celery's ``task_publish_retry_policy``: a publish waits out an outage for about as long."""
    return {"max_retries": OUTAGE_RETRIES, "interval_start": BACKOFF_BASE, "interval_step": 0.5,
            "interval_max": BACKOFF_CAP}


def retry_settings() -> dict[str, Any]:
    """Celery settings that make publishing and the Redis result backend retry for about as long
    (storing a result or a state: a task whose body finished is not failed because Redis
    blinked). Celery's backend sleeps a random fraction of each backoff step (full jitter),
    hence twice the retries."""
    return {"task_publish_retry_policy": publish_retry_policy(),
            "result_backend_always_retry": True,
            "result_backend_max_retries": 2 * OUTAGE_RETRIES,
            "result_backend_base_sleep_between_retries_ms": int(BACKOFF_BASE * 1000),
            "result_backend_max_sleep_between_retries_ms": int(BACKOFF_CAP * 1000)}
