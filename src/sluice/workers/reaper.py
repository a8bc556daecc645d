"""Orphan recovery: put back messages held by workers that died, within seconds, not hours.

Redis redelivers an unacknowledged message only after the visibility timeout (hours, so that a
long task on a live worker is never run twice). A worker that dies hard (SIGKILL, an OOMKilled
pod) leaves its messages in kombu's ``unacked`` hash until then. Every worker runs this sweep;
one at a time (a Redis lock) looks at each held message and restores it to its queue when:

* the ledger says which worker instance took it, and that instance's heartbeat is gone; or
* no claim matches it (the worker died before running it) and it has been held longer than
  ``orphan_grace`` seconds, past its ETA if it has one.

The redelivered message then meets the ledger on the next worker (see ``request.py``), which
counts the lost attempt and lets the retry policy decide.

Messages can also wait, not yet taken, in a dead worker's own direct queue (a sticky retry, or
a remote call sent to the worker holding its environment). Those name their home queue in a
header; the sweep moves them there once the worker's heartbeat is gone.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from typing import Any

import redis
from celery import Celery
from celery.utils.nodenames import WORKER_DIRECT_EXCHANGE, WORKER_DIRECT_QUEUE_FORMAT

from sluice import keys
from sluice.tasks.escalation import ATTEMPT_HEADER, STICKY_HEADER
from sluice.workers import ledger
from sluice.workers.periodic import Periodic

log = logging.getLogger("sluice.reaper")

#: kombu's binding table of Celery's direct-queue exchange: one member per worker direct queue.
DIRECT_BINDINGS = f"_kombu.binding.{WORKER_DIRECT_EXCHANGE.name}"
BINDING_SEPARATOR = "\x06\x16"


class OrphanReaper(Periodic):
    """Sweeps every ``interval`` seconds for messages whose holder died."""

    def __init__(self, app: Celery, client: redis.Redis, instance: str, interval: float, grace: float) -> None:
        super().__init__("sluice-orphan-reaper", interval)
        self.app = app
        self.client = client
        self.instance = instance
        self.grace = grace
        options = app.conf.broker_transport_options or {}
        self.unacked_key = options.get("unacked_key", "unacked")
        self.unacked_index_key = options.get("unacked_index_key", "unacked_index")
        #: Remove one message from a list and append its rewritten copy to another, atomically;
        #: nothing happens if a consumer took the message meanwhile.
        self._move = client.register_script(
            "if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then redis.call('RPUSH', KEYS[2], ARGV[2]) return 1 end "
            "return 0")

    def tick(self) -> list[str]:
        return self.sweep_once()

    def sweep_once(self) -> list[str]:
        """One sweep (if this worker holds the lock); returns the task ids restored."""
        if not self.client.set(keys.REAPER_LOCK, self.instance, nx=True, px=int(self.interval * 2000)):
            return []
        restored = []
        now = time.time()
        for tag, raw in self.client.hgetall(self.unacked_key).items():
            message = json.loads(raw)[0]
            if self._orphaned(tag, message, now):
                self._restore(tag)
                restored.append(message["headers"].get("id", "?"))
        if restored:
            log.warning("restored %d message(s) held by dead workers: %s", len(restored), ", ".join(restored))
        return restored + self.rehome_direct_queues()

    def rehome_direct_queues(self) -> list[str]:
        """Move messages waiting in dead workers' direct queues to their home queues."""
        queues = [m.decode().rsplit(BINDING_SEPARATOR, 1)[-1] for m in self.client.smembers(DIRECT_BINDINGS)]
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:  # one round trip for every worker the binding table remembers
            pipe.exists(keys.worker_heartbeat(direct_queue_owner(queue)))
            pipe.llen(queue)
        replies = pipe.execute()
        moved = []
        for queue, alive, waiting in zip(queues, replies[::2], replies[1::2]):
            if alive or not waiting:
                continue
            for raw in self.client.lrange(queue, 0, -1):
                message = json.loads(raw)
                home = (message.get("headers") or {}).get(STICKY_HEADER)
                if not home:
                    continue
                message["properties"]["delivery_info"].update(exchange="", routing_key=home)
                if self._move(keys=[queue, home], args=[raw, json.dumps(message)]):
                    moved.append(message["headers"].get("id", "?"))
        if moved:
            log.warning("moved %d message(s) from dead workers' own queues to their home queues: %s",
                        len(moved), ", ".join(moved))
        return moved

    def _orphaned(self, tag: bytes, message: dict[str, Any], now: float) -> bool:
        headers = message.get("headers") or {}
        task_id = headers.get("id")
        held = ledger.current(self.client, task_id) if task_id else None
        if held is not None and held.attempt == int(headers.get(ATTEMPT_HEADER) or 1):
            return not ledger.holder_running(self.client, task_id, held)
        since = self.client.zscore(self.unacked_index_key, tag) or now
        eta = headers.get("eta")
        due = max(since, datetime.fromisoformat(eta).timestamp()) if eta else since
        return now - due > self.grace

    def _restore(self, tag: bytes) -> None:
        """kombu's own restore (queue lookup, priorities, redelivered flag), on a short-lived channel."""
        with self.app.connection_for_write() as connection:
            connection.default_channel.qos.restore_by_tag(tag.decode())


def direct_queue_owner(queue: str) -> str:
    """The worker a direct queue belongs to (``cpu@host.dq2`` -> ``cpu@host``)."""
    return queue.removesuffix(WORKER_DIRECT_QUEUE_FORMAT.format(hostname=""))
