"""sluice's kombu transport: kombu's Redis transport with reliable fetch, dead letters and leases.

Every :class:`sluice.App` uses it (``broker_transport = "sluice"``), so a plain
``celery -A app worker`` gets it too. The channel is put together here from one part per job,
each a module saying what it changes in kombu's and why (the key layout is in ``layout``):

* ``qos``: acknowledgements carried by the next fetch, and the fetch gate of a packed worker;
* ``fetching``: reliable fetch (``fetch.lua``) and the bells an idle worker waits on;
* ``forwarding``: a held message moved to another queue (``forward.lua``) or to the dead letters;
* ``leases``: held messages renewed, so the visibility timeout restores only abandoned ones;
* ``publishing``: a publish rings its queue's bell; events go on a connection without replies.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError

from sluice import redis_client
from sluice.ids import new_id
from sluice.queues.broker.fetching import Fetching
from sluice.queues.broker.forwarding import Forwarding
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.broker.leases import LeaseRenewal, Leasing
from sluice.queues.broker.publishing import BellBatch, EventPublishing
from sluice.queues.broker.qos import AckCarrying

#: The alias every sluice App names in ``broker_transport`` (``SENTINEL_ALIAS`` for ``sentinel://``).
ALIAS, SENTINEL_ALIAS = "sluice", "sluice-sentinel"
#: The URL scheme of the Redis each alias reaches (what a connection's URI shows, see ``amqp``).
SCHEMES = {ALIAS: "redis", SENTINEL_ALIAS: "sentinel"}


class ReliableChannel(Forwarding, Leasing, Fetching, AckCarrying, EventPublishing, kombu_redis.Channel):
    """A Redis channel that fetches with ``fetch.lua`` and waits on bells (see the module docstring)."""

    #: The client ``conn_or_acquire`` hands out (see there).
    _shared_client: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layout = RedisLayout(
            self.unacked_key, self.unacked_index_key, self.sep, tuple(self.priority_steps), self.global_keyprefix
        )

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """kombu's, but one client per channel (for its current pool) instead of a new
        ``redis.Redis`` for every publish and ack: building one was a fifth of a publish's time.

        Once the channel's connection has released its transport (Celery's consumer does when
        the broker is lost, and may close the channel after that) Redis is unreachable from
        here: a connection error, which closing ignores, not kombu's AttributeError, which
        killed the worker."""
        if client:
            yield client
            return
        if self.connection.client is None:
            raise RedisConnectionError("this channel's broker connection was released")
        pool = self.pool
        if self._shared_client is None or self._shared_client.connection_pool is not pool:
            self._shared_client = self._create_client()
        yield self._shared_client

    def create_publish_batch(self, max_size: int) -> BellBatch:
        return BellBatch(self, max_size)

    def _next_delivery_tag(self) -> str:
        return new_id()  # kombu's uuid4 string, made in a third of the time


class Transport(LeaseRenewal, kombu_redis.Transport):
    """kombu's Redis transport with :class:`ReliableChannel`; renews held messages' leases on a timer."""

    Channel = ReliableChannel
    #: The worker's event loop, once the transport is registered with one (None: a consumer that
    #: drains events without one); a channel waiting for a rate limit sets a timer on it.
    event_loop: Any = None

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)
        self.event_loop = loop

    #: Which errors kombu's ``Connection.ensure`` (a publish's retry policy) reconnects after:
    #: every connection error, and a write refused by a master demoted in a failover. Without
    #: this kombu treats the transport as unable to tell, and gives up at the second error after
    #: a successful reconnect, though a Redis just back from a restart can drop a command more
    #: than once (pooled connections from before the kill, an AOF still loading). An error
    #: Redis answers a command with (NOREPLICAS, OOM) is a channel error: tried again at once,
    #: without a reconnect, and raised as kombu's OperationalError, as before.
    recoverable_connection_errors = (*kombu_redis.Transport.connection_errors, ReadOnlyError)
    recoverable_channel_errors = kombu_redis.Transport.channel_errors


class SentinelChannel(ReliableChannel, kombu_redis.SentinelChannel):
    """:class:`ReliableChannel` on the master Redis Sentinel names (kombu's Sentinel pool: after
    a failover the next connection goes to the new master)."""


class SentinelTransport(Transport):
    """The sluice transport for ``sentinel://`` broker URLs (transport options ``master_name``,
    ``sentinel_kwargs``; the App sets them from its settings)."""

    Channel = SentinelChannel
    # kombu's base Transport declares default_port = None; every transport of it sets an int
    default_port = kombu_redis.SentinelTransport.default_port  # type: ignore[assignment]


def alias_for(url: str) -> str:
    """The transport alias an App names for a broker URL."""
    return SENTINEL_ALIAS if redis_client.is_sentinel(url) else ALIAS


TRANSPORT_ALIASES.setdefault(ALIAS, f"{__name__}:Transport")
TRANSPORT_ALIASES.setdefault(SENTINEL_ALIAS, f"{__name__}:SentinelTransport")
