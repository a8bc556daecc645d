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

A held message that does not decode (not valid UTF-8 JSON: taken before the fetch script
refused such messages, or written by another program) cannot be judged by its claim. It is
skipped while its holder renews its lease, and once no one has for ``orphan_grace`` seconds it
becomes a dead letter of its queue, bytes intact, as the fetch script would have made it: never
put back to fail every fetch, never a reason to stop sweeping for the others.

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

from sluice import entries, keys
from sluice.headers import Headers, attempt_of
from sluice.queues.broker.layout import Held, RedisLayout, message_of, restore
from sluice.queues.broker.letters import dead_letter_held
from sluice.queues.broker.moves import move_waiting, routed_to
from sluice.tasks import ledger
from sluice.workers.periodic import Periodic

log = logging.getLogger("sluice.reaper")


class OrphanReaper(Periodic):
    """Sweeps every ``interval`` seconds for messages whose holder died."""

    def __init__(self, app: Celery, client: redis.Redis, instance: str, interval: float, grace: float) -> None:
        super().__init__("sluice-orphan-reaper", interval)
        self.app = app
        self.client = client
        self.instance = instance
        self.grace = grace
        self.layout = RedisLayout.of_app(app)

    def tick(self) -> list[str]:
        return self.sweep_once()

    def sweep_once(self) -> list[str]:
        """One sweep (if this worker holds the lock); returns the task ids restored."""
        if not self.client.set(keys.REAPER_LOCK, self.instance, nx=True, px=int(self.interval * 2000)):
            return []
        restored = []
        now = time.time()
        readable, unreadable = self.layout.held_entries(self.client)
        for held in readable:  # a claim or heartbeat that does not decode leaves that one message alone
            if entries.decode_one("held message's claim", held, lambda h: self._orphaned(h, now), False):
                restore(self.app, held.tag)
                restored.append(held.task_id or "?")
        if restored:
            log.warning("restored %d message(s) held by dead workers: %s", len(restored), ", ".join(restored))
        for (tag, entry), why in unreadable:
            self._dead_letter_unreadable(tag, entry, why, now)
        return restored + self.rehome_direct_queues()

    def _dead_letter_unreadable(self, tag: bytes, entry: bytes, why: Exception, now: float) -> None:
        """A held message that does not decode: a dead letter once its lease lapsed (see the module docstring)."""
        since = self.layout.held_since(self.client, tag)
        if since is None or now - since <= self.grace:
            return
        reason = f"unreadable while held ({type(why).__name__}: {why}), and its holder stopped renewing it"
        if dead_letter_held(self.client, self.layout, tag, entry, reason):
            log.warning("moved held message %r, which does not decode, to the dead letters: %s", tag, why)

    def rehome_direct_queues(self) -> list[str]:
        """Move messages waiting in dead workers' direct queues to their home queues."""
        queues = self.layout.bound_queues(self.client, WORKER_DIRECT_EXCHANGE.name)
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:  # one round trip for every worker the binding table remembers
            pipe.exists(keys.worker_heartbeat(direct_queue_owner(queue)))
            pipe.llen(queue)
        replies = pipe.execute()
        moved = []
        for queue, alive, waiting in zip(queues, replies[::2], replies[1::2]):
            if alive or not waiting:
                continue
            for raw, message, home in entries.decode_each(
                "waiting message", self.client.lrange(queue, 0, -1), _rehomed
            ):
                if not home:
                    continue
                if move_waiting(self.client, queue, home, raw, json.dumps(message)):
                    moved.append(str(message["headers"].get("id", "?")))
        if moved:
            log.warning(
                "moved %d message(s) from dead workers' own queues to their home queues: %s",
                len(moved),
                ", ".join(moved),
            )
        return moved

    def _orphaned(self, held: Held, now: float) -> bool:
        headers = held.message.get("headers") or {}
        task_id = held.task_id
        claim = ledger.current(self.client, task_id) if task_id else None
        if task_id and claim is not None and claim.attempt == attempt_of(headers):
            return not ledger.holder_running(self.client, task_id, claim)
        since = self.layout.held_since(self.client, held.tag) or now
        eta = headers.get("eta")
        due = max(since, datetime.fromisoformat(eta).timestamp()) if eta else since
        return now - due > self.grace


def _rehomed(raw: bytes | str) -> tuple[bytes | str, dict[str, Any], str | None]:
    """A message waiting in a worker's own queue: as it was, routed to its home queue, and that
    home (None: it has none, and stays)."""
    message = message_of(raw)
    home = Headers.read(message.get("headers") or {}).sticky
    return raw, routed_to(message, home) if home else message, home


def direct_queue_owner(queue: str) -> str:
    """The worker a direct queue belongs to (``cpu@host.dq2`` -> ``cpu@host``)."""
    return queue.removesuffix(WORKER_DIRECT_QUEUE_FORMAT.format(hostname=""))
