"""What every ``sluice`` command shares, written once: the console, the ``-A/--app`` option, the
App it names, and the broker a read-only command talks to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import click
import redis
from celery.app.utils import find_app

from sluice import redis_client, terminal
from sluice.app import App
from sluice.config import Settings, embedded_broker_url
from sluice.queues.catalog import Catalog

console = terminal.console()

F = TypeVar("F", bound=Callable[..., Any])


def app_option(help: str, *, default: str | None = None, required: bool = False) -> Callable[[F], F]:
    """The ``-A/--app`` option: the module (or ``module:attr``) holding the sluice App, handed to
    the command as ``app_name``; ``help`` says what the command uses it for."""
    return click.option(
        "-A", "--app", "app_name", default=default, required=required, show_default=default is not None, help=help
    )


def load_app(name: str) -> App:
    """Import ``module`` or ``module:attr`` and return the sluice App in it."""
    try:
        app = find_app(name)
    except Exception as exc:  # find_app raises anything the import raises
        raise click.BadParameter(f"cannot load app {name!r}: {exc}", param_hint="-A/--app") from exc
    if not isinstance(app, App):
        raise click.BadParameter(f"{name!r} holds a {type(app).__name__}, not a sluice.App", param_hint="-A/--app")
    return app


class Broker(NamedTuple):
    """What the read-only commands need: Redis, the classes, and the rest of the settings."""

    client: redis.Redis
    catalog: Catalog
    settings: Settings


def reader(url: str, timeout: float = 5) -> redis.Redis:
    """A client for a command that reads the broker: it says so at once when Redis does not answer,
    instead of waiting the outage out as a worker does."""
    return redis_client.connect(url, wait_out_outages=False, socket_timeout=timeout)


def configured_broker_url(settings: Settings) -> str | None:
    """The configured broker's URL, else a running ``sluice up``'s, else None."""
    return settings.broker_url or embedded_broker_url(settings.home)


def broker_client(app_name: str | None) -> Broker:
    """Redis and the settings of ``app_name``, or the configured ones (a running ``sluice up``)."""
    if app_name:
        app = load_app(app_name)
        return Broker(app.redis, app.catalog, app.settings)
    settings = Settings.load()
    url = configured_broker_url(settings)
    if not url:
        raise click.ClickException("no broker: set SLUICE_BROKER_URL or start one with `sluice up`")
    return Broker(reader(url), settings.catalog, settings)


def format_age(seconds: float) -> str:
    """``seconds`` as a reader counts them: 3d, 5h, 12m or 40s."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
