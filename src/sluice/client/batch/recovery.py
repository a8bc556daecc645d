"""Recovery: resume a run from what Redis and the sink hold, and resend chunks that were lost.

* **Resume.** Records the result cache holds but the sink lacks (a driver died after workers
  cached them) go to the sink first; ids in the SkipSet without a record were dispatched by an
  earlier driver and are awaited, not dispatched again. ``--rerun-failed`` forgets failures.
* **Lost chunks.** A message can vanish between a queue and a worker's hold (the worker was
  killed after taking it, before kombu recorded it as unacknowledged). A chunk that has not
  started and is in no queue and no hold on two checks ``lost_check_interval`` (10 s) apart is
  sent again. Ids an earlier driver dispatched have no chunk id here: when no message of the run
  is queued, held or waiting in a worker's own queue on two such checks, those still awaited are
  sent again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import redis
from celery.utils.nodenames import WORKER_DIRECT_EXCHANGE

from sluice import entries
from sluice.keys import RunPart
from sluice.queues.broker.layout import RedisLayout, task_args
from sluice.tasks.batch.records import FAILED, RERUN, Failure, decode

if TYPE_CHECKING:
    from sluice.client.batch.driver import Driver


def resume(driver: Driver, done: set[str]) -> None:
    """Sink what the cache computed meanwhile; await what earlier drivers dispatched (``done``:
    the ids the sink holds, updated here). A cached record that does not decode is forgotten and
    its item dispatched again, as a lost one is."""
    client, results = driver.client, driver.key(RunPart.RESULTS)
    rerun_failed = driver.settings.rerun_failed
    cached, unreadable = entries.split(
        "batch result",
        client.hscan_iter(results, count=5000),
        lambda item: (item[0], item[1], _runs_again(item[1], rerun_failed)),
    )
    # lost (or failed, with --rerun-failed), or unreadable: forget it, dispatch it again
    rerun = [raw_id for raw_id, _, again in cached if again] + [raw_id for (raw_id, _), _ in unreadable]
    lines = {raw_id: raw for raw_id, raw, again in cached if not again and raw_id.decode(errors="replace") not in done}
    sunk = {record.id for record in driver.write(list(lines.values()), only_waiting=False)}
    rerun += [raw_id for raw_id in lines if raw_id.decode(errors="replace") not in sunk]  # the sink could not read it
    done |= sunk
    if rerun:
        client.hdel(results, *rerun)
        client.srem(driver.key(RunPart.SKIP), *rerun)
    client.delete(driver.key(RunPart.READY))
    skip = entries.decode_each("dispatched id", client.sscan_iter(driver.key(RunPart.SKIP), count=5000), bytes.decode)
    driver.inherited.update(item_id for item_id in skip if item_id not in done)
    driver.waiting |= driver.inherited


def _runs_again(raw: bytes, rerun_failed: bool) -> bool:
    if b'"status"' not in raw:  # no status key anywhere: a success (any key order), nothing to decide
        return False
    record = decode(raw)
    return isinstance(record, Failure) and (record.status in RERUN or rerun_failed and record.status == FAILED)


class LostChunks:
    """Finds chunks lost between a queue and a worker's hold (see the module docstring)."""

    def __init__(self, client: redis.Redis, layout: RedisLayout, queue: str, every: float) -> None:
        self.client, self.layout, self.queue, self.every = client, layout, queue, every
        self._suspects: set[str] = set()
        self._last = time.monotonic()

    def lost(self, unstarted: set[str]) -> set[str]:
        """Of the chunk ids with no result yet, those missing from every queue and hold on this
        check and the previous one (checks run at most every ``every`` seconds)."""
        if time.monotonic() - self._last < self.every:
            return set()
        self._last = time.monotonic()
        held = {item.task_id for item in self.layout.held(self.client)}
        queued = self.layout.waiting_task_ids(self.client, self.queue)
        missing = unstarted - held - queued
        lost, self._suspects = missing & self._suspects, missing
        return lost


class LostInherited:
    """Tells when the chunks an earlier driver dispatched are gone (see the module docstring)."""

    def __init__(self, client: redis.Redis, layout: RedisLayout, queue: str, run_id: str, every: float) -> None:
        self.client, self.layout, self.queue, self.run_id, self.every = client, layout, queue, run_id, every
        self._suspect = False
        self._last = time.monotonic()

    def gone(self) -> bool:
        """True when no message of this run existed on this check and the previous one."""
        if time.monotonic() - self._last < self.every:
            return False
        self._last = time.monotonic()
        queues = [self.queue, *self.layout.bound_queues(self.client, WORKER_DIRECT_EXCHANGE.name)]
        messages = [m for q in queues for m in self.layout.waiting(self.client, q)]
        messages += [item.message for item in self.layout.held(self.client)]
        present = any((task_args(m) or [None])[0] == self.run_id for m in messages)
        gone, self._suspect = self._suspect and not present, not present
        return gone
