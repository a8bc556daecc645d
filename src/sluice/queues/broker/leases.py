"""Leases: a worker renews the delivery time of every message it holds (ETA tasks waiting for
their time included), so kombu's visibility timeout restores only messages whose holder stopped
renewing: an ETA or a task longer than the visibility timeout still runs once. The orphan reaper
(``sluice.workers.reaper``) judges a holder by the same renewals.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kombu import Connection
from kombu.transport import redis as kombu_redis

log = logging.getLogger("sluice.transport")

#: The transport option that sets the lease renewal interval (seconds; see :func:`lease_interval`).
LEASE_OPTION = "sluice_lease_interval"


def lease_interval(visibility_timeout: float, orphan_grace: float | None = None) -> float:
    """How often a worker renews its held messages: well inside the visibility timeout and the
    reaper's orphan grace, which both judge a holder by how long ago it renewed."""
    return max(0.25, min(visibility_timeout / 4, (orphan_grace or visibility_timeout) / 4, 30.0))


class Leasing(kombu_redis.Channel):
    """The channel's side: renew what it holds."""

    def renew_leases(self) -> None:
        """Move the delivery time of every message this channel holds to now (one round trip)."""
        tags = self.qos.held_tags()
        if tags:
            with self.conn_or_acquire() as client:
                client.zadd(self.unacked_index_key, dict.fromkeys(tags, time.time()), xx=True)


class LeaseRenewal(kombu_redis.Transport):
    """The transport's side: renew every channel's leases on the worker's event loop timer."""

    # kombu declares both None on its base Transport; the redis transport's __init__ sets them
    client: Connection  #: the connection this transport serves
    cycle: kombu_redis.MultiChannelPoller  # type: ignore[assignment]  # kombu's base says FairCycle | None

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)
        options = self.client.transport_options or {}
        interval = options.get(LEASE_OPTION) or lease_interval(
            options.get("visibility_timeout", self.Channel.visibility_timeout)
        )
        loop.call_repeatedly(interval, self._renew_leases)

    def _renew_leases(self) -> None:
        for channel in list(self.cycle._channels):
            try:
                channel.renew_leases()
            except channel.connection_errors:
                log.debug("lease renewal: broker unreachable, will retry", exc_info=True)
