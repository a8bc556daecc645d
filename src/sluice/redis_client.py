"""The one way sluice connects to Redis for its own state (ledger, heartbeats, runs, catalog),
a plain ``redis://`` one or the master behind Redis Sentinel (``sentinel://``).

A Redis that restarts (a pod rescheduled, an AOF reload) is unreachable for seconds. Every
command on a client from :func:`connect` retries connection and timeout errors with
exponential backoff for about ``outage_wait`` seconds (two minutes) before it raises, so a blink is waited
out instead of failing whatever was running; Celery's publishing and result backend are told
the same (see :func:`retry_settings`). Past that bound the error surfaces, as
:class:`redis.ConnectionError` (kombu's ``OperationalError`` from a publish).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from sluice.config import Settings
from sluice.errors import ConfigurationError

#: Celery's and kombu's scheme for a broker reached through Redis Sentinel, and its default port.
SENTINEL_SCHEME, SENTINEL_PORT = "sentinel", 26379

#: Backoff between attempts: doubling from 0.1 s, at most 5 s.
BACKOFF_BASE, BACKOFF_CAP = 0.1, 5.0


def outage_retries(wait: float) -> int:
    """The retries whose backoffs (0.2 + 0.4 + ... then 5 s each) first add up to ``wait`` seconds:
    29 for the default two minutes."""
    retries, waited = 0, 0.0
    while waited < wait:
        retries += 1
        waited += min(BACKOFF_CAP, BACKOFF_BASE * 2**retries)
    return retries


def outage_retry(wait: float) -> Retry:
    """redis-py's retry policy for sluice's clients (a new object per client: it holds state)."""
    return Retry(
        ExponentialBackoff(cap=BACKOFF_CAP, base=BACKOFF_BASE),
        outage_retries(wait),
        supported_errors=(ConnectionError, TimeoutError),
    )


def connect(url: str, *, wait_out_outages: bool = True, settings: Settings | None = None, **kwargs: Any) -> redis.Redis:
    """A client on ``url`` that waits out a Redis outage (see the module docstring); with
    ``wait_out_outages=False`` one that fails at once (a command line reading figures). A
    ``sentinel://`` URL gives a client on the master the Sentinels name, found again after a
    failover (``settings``' sentinel_master and sentinel_password; default: the configured ones)."""
    if wait_out_outages:
        wait = (settings or Settings.load()).outage_wait
        kwargs |= {"retry": outage_retry(wait), "retry_on_error": [ConnectionError, TimeoutError]}
    else:
        kwargs |= {"retry": Retry(ExponentialBackoff(), 0)}
    try:
        if is_sentinel(url):
            return sentinel_master(url, settings, **kwargs)
        return redis.Redis.from_url(url, **kwargs)
    except ValueError as exc:  # a port or db that is not a number
        raise ConfigurationError(
            f"broker {url!r} is not a Redis URL ({exc}); use redis://[:password@]host:port/db or sentinel://..."
        ) from None


def is_sentinel(url: str) -> bool:
    return url.split("://", 1)[0] == SENTINEL_SCHEME


def sentinel_nodes(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The Sentinels of ``sentinel://[:password@]host:port[/db];sentinel://host2:port...`` (Celery's
    and kombu's form) and the master's connection options (password, username, db) from the first."""
    nodes: list[tuple[str, int]] = []
    options: dict[str, Any] = {}
    for part in url.split(";"):
        parsed = urlsplit(part.strip())
        if parsed.scheme != SENTINEL_SCHEME or not parsed.hostname:
            raise ConfigurationError(
                f"broker {url!r}: {part!r} is not sentinel://host:port; a Sentinel broker is "
                "sentinel://[:password@]host:port[/db], ';' between Sentinels"
            )
        nodes.append((parsed.hostname, parsed.port or SENTINEL_PORT))
        if not options:
            options = {
                "password": unquote(parsed.password) if parsed.password else None,
                "username": unquote(parsed.username) if parsed.username else None,
                "db": int(parsed.path.strip("/") or 0),
            }
    return nodes, options


def sentinel_master(url: str, settings: Settings | None = None, **kwargs: Any) -> redis.Redis:
    """A client on the current master of the group ``settings.sentinel_master`` names."""
    settings = settings or Settings.load()
    name = require_master_name(url, settings)
    nodes, options = sentinel_nodes(url)
    sentinels = Sentinel(nodes, sentinel_kwargs=sentinel_kwargs(settings))
    return sentinels.master_for(
        name,
        redis_class=redis.Redis,
        connection_class=MasterConnection,
        **{k: v for k, v in options.items() if v is not None},
        **kwargs,
    )


class MasterConnection(SentinelManagedConnection):
    """A connection to the master Sentinel names that asks again on every reconnect. redis-py's
    own reconnects inside one command's retries (``connect_check_health``) reuse the address it
    had, so a command waiting out a failover would knock on the dead master until it gave up."""

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        if self._sock is None and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(*args, **kwargs)


def require_master_name(url: str, settings: Settings) -> str:
    if not settings.sentinel_master:
        raise ConfigurationError(
            f"broker {url!r} is a Sentinel URL but no master name is set: set sentinel_master "
            "(SLUICE_SENTINEL_MASTER) to the name the Sentinels monitor, e.g. mymaster"
        )
    return settings.sentinel_master


def sentinel_kwargs(settings: Settings) -> dict[str, Any]:
    """How to talk to the Sentinels themselves (kombu's and Celery's ``sentinel_kwargs``)."""
    return {"socket_timeout": 5, **({"password": settings.sentinel_password} if settings.sentinel_password else {})}


def publish_retry_policy(wait: float) -> dict[str, float]:
    """Celery's ``task_publish_retry_policy``: a publish waits out an outage for about as long."""
    return {
        "max_retries": outage_retries(wait),
        "interval_start": BACKOFF_BASE,
        "interval_step": 0.5,
        "interval_max": BACKOFF_CAP,
    }


def retry_settings(wait: float) -> dict[str, Any]:
    """Celery settings that make publishing and the Redis result backend retry for about as long
    (storing a result or a state: a task whose body finished is not failed because Redis
    blinked). Celery's backend sleeps a random fraction of each backoff step (full jitter),
    hence twice the retries."""
    return {
        "task_publish_retry_policy": publish_retry_policy(wait),
        "result_backend_always_retry": True,
        "result_backend_max_retries": 2 * outage_retries(wait),
        "result_backend_base_sleep_between_retries_ms": int(BACKOFF_BASE * 1000),
        "result_backend_max_sleep_between_retries_ms": int(BACKOFF_CAP * 1000),
    }
