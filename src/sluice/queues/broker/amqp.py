"""Celery's messaging layer of a sluice App (its ``amqp_cls``): its broker connection and the
queues it knows.

The connection: kombu writes a connection's URI with its transport's alias as the scheme (``sluice://``,
``sluice-sentinel://``). Tools that read that URI to choose how to talk to the broker themselves
know only the real ones: Flower's Broker page and ``/api/queues/length`` answered "'redis' broker
is not supported". This connection reports ``redis://`` or ``sentinel://`` (the scheme of the
Redis the transport reaches) and still uses sluice's transport.

The queues: Celery knows the queues of ``task_queues`` (by default only the default one) and
adds others as its router names them. Tools that act on "every queue of the app" read that
list: ``celery purge`` purged only the default class. A sluice App knows every class queue and
the intake from the start; a worker started without ``-Q`` still consumes only the default class
(Celery consumes by default only the queues of ``task_queues``, which sluice leaves as it is).
"""

from __future__ import annotations

from typing import Any

import kombu
from celery.app.amqp import AMQP, Queues

from sluice.queues.broker.transport import SCHEMES


class BrokerConnection(kombu.Connection):
    """kombu's connection; :meth:`as_uri` names the Redis scheme instead of sluice's alias."""

    def as_uri(self, include_password: bool = False, mask: str = "**", *args: Any) -> str:
        uri: str = super().as_uri(include_password, mask, *args)
        alias, separator, rest = uri.partition("://")
        scheme = SCHEMES.get(alias)
        return f"{scheme}{separator}{rest}" if scheme and separator else uri


class SluiceAMQP(AMQP):
    """Celery's messaging layer with :class:`BrokerConnection`, knowing every queue of the App."""

    Connection = BrokerConnection

    def Queues(self, queues: Any, *args: Any, **kwargs: Any) -> Queues:  # noqa: N802 - Celery's name
        known: Queues = super().Queues(queues, *args, **kwargs)
        for name in (*self.app.catalog.names, self.app.settings.intake_queue):
            if name not in known:
                known.add(known.new_missing(name))  # as the router's first use of the name adds it
        return known
