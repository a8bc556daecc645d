"""The broker connection of a sluice App: kombu's, whose URI names the Redis scheme it speaks.

kombu writes a connection's URI with its transport's alias as the scheme (``sluice://``,
``sluice-sentinel://``). Tools that read that URI to choose how to talk to the broker themselves
know only the real ones: Flower's Broker page and ``/api/queues/length`` answered "'redis' broker
is not supported". This connection reports ``redis://`` or ``sentinel://`` (the scheme of the
Redis the transport reaches) and still uses sluice's transport.
"""

from __future__ import annotations

from typing import Any

import kombu
from celery.app.amqp import AMQP

from sluice.queues.broker.transport import SCHEMES


class BrokerConnection(kombu.Connection):
    """kombu's connection; :meth:`as_uri` names the Redis scheme instead of sluice's alias."""

    def as_uri(self, include_password: bool = False, mask: str = "**", *args: Any) -> str:
        uri: str = super().as_uri(include_password, mask, *args)
        alias, separator, rest = uri.partition("://")
        scheme = SCHEMES.get(alias)
        return f"{scheme}{separator}{rest}" if scheme and separator else uri


class SluiceAMQP(AMQP):
    """Celery's messaging layer with :class:`BrokerConnection` (the App's ``amqp_cls``)."""

    Connection = BrokerConnection
