"""The batch-run driver behind ``sluice compute``: the dispatch window.

It streams ``plan()`` lazily with a bounded in-flight window, dispatches each id at most once per
run (the SkipSet, a Redis set), packs items into chunks whose size adapts to how long items take
(per-message overhead is what limits tiny items), and moves records from the Redis result cache
to the sink. Once a chunk has ended (its message acknowledged: never delivered again) and every
record of it is in the sink, its successes leave the cache, so Redis holds what recovery needs
(the SkipSet, failures, what is in flight), not every record of the run. Resume and lost chunks
are :mod:`recovery`'s, failing workers :mod:`quarantine`'s, the end of a run and Ctrl-C
:mod:`finalise`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from celery import states

from sluice import entries, keys
from sluice.app import App
from sluice.client.batch import recovery
from sluice.client.batch.progress import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Progress,
    RunSettings,
)
from sluice.client.batch.quarantine import Quarantine
from sluice.client.batch.sink import Sink
from sluice.compute import Compute
from sluice.headers import Headers
from sluice.keys import RunPart
from sluice.queues.broker.layout import RedisLayout, task_states
from sluice.tasks.batch import RUN_CHUNK_TASK
from sluice.tasks.batch.records import (
    CANCELLED,
    FAILED,
    LOST,
    Failure,
    Ready,
    Record,
    decode,
    encode,
)
from sluice.tasks.batch.taskfile import TaskFile
from sluice.tasks.retry import RetryOn, RetryPolicy


class Driver:
    """One run: :meth:`run` dispatches ``plan()`` and sinks records until every id has one."""

    #: How long a chunk may have ended before its still-awaited items are given up as lost: past
    #: a failed chunk's records, which its worker writes just after storing the failure.
    ended_grace = 5.0

    def __init__(
        self,
        app: App,
        task_file: TaskFile,
        sink: Sink,
        settings: RunSettings,
        slots: int,
        on_record: Callable[[Record], None] = lambda record: None,
        on_progress: Callable[[Progress], None] = lambda progress: None,
        secret: str | None = None,
    ) -> None:
        """``secret`` signs the task file workers load (default: the app's, as remote calls use)."""
        self.app, self.task_file, self.sink, self.settings = app, task_file, sink, settings
        self.secret = secret or app.settings.signing_secret()
        self.slots = max(slots, 1)
        self.on_record = on_record
        self.on_progress = on_progress
        self.client = app.redis
        self.layout = RedisLayout.of_app(app)
        self.progress = Progress()
        self.quarantine = Quarantine(app, settings.queue, settings.quarantine_after, self.progress)
        every = app.settings.lost_check_interval
        self.lost_chunks = recovery.LostChunks(self.client, self.layout, settings.queue, every)
        self.lost_inherited = recovery.LostInherited(self.client, self.layout, settings.queue, settings.run_id, every)
        self._inherited_items: dict[str, dict[str, Any]] = {}  # inherited ids' items, as plan() yielded them
        self.chunks: dict[str, list[str]] = {}  # chunk task id -> item ids without a record yet
        self.waiting: set[str] = set()  # ids in flight (this driver's or an earlier one's)
        self.inherited: set[str] = set()  # ids an earlier driver of this run dispatched
        self.claimed: set[str] = set()  # ids taken from plan(), not yet published
        self.item_seconds: float | None = None  # moving average of execute() time (None: unknown)
        self.stopping = False
        self._items: dict[str, list[dict[str, Any]]] = {}  # chunk id -> its items, to resend a lost chunk
        self._sunk_ok: set[str] = set()  # ids whose success is in the sink, their chunk not ended
        self._last_checkpoint = 0.0
        self._last_poll = 0.0
        self._ended_at: dict[str, float] = {}  # chunk id -> when it was first seen ended with ids awaited

    def key(self, part: RunPart) -> str:
        return keys.run(self.settings.run_id, part)

    # --- set-up -----------------------------------------------------------------------------

    def publish_source(self) -> None:
        """Workers load the task file from here, signed (they need no copy of it, and run no
        task file a holder of the secret did not store)."""
        pipe = self.client.pipeline()
        pipe.delete(self.key(RunPart.SOURCE), self.key(RunPart.CANCEL))
        sealed = self.task_file.sealed(self.settings.run_id, self.secret)
        # redis-py's mapping= has invariant keys of a wide union, so it refuses a dict[str, str]
        pipe.hset(self.key(RunPart.SOURCE), mapping=sealed)  # type: ignore[arg-type]
        pipe.execute()

    def reset(self) -> None:
        """A fresh run under a name used before: forget that run's dispatches and results."""
        self.client.delete(*(self.key(part) for part in (RunPart.SKIP, RunPart.RESULTS, RunPart.READY, RunPart.CANCEL)))

    # --- the loop -----------------------------------------------------------------------------

    def run(self, done: set[str]) -> int:
        """Dispatch every id not in ``done`` (the sink's) and sink its record; returns the exit code."""
        self.publish_source()
        recovery.resume(self, done)
        self.progress.in_flight = len(self.waiting)
        items = self._fresh(self.task_file.plan(), done)
        batch: list[dict[str, Any]] = []
        while not self.stopping:
            # ids an earlier driver dispatched that plan() has not yielded yet do not fill the window:
            # reading plan() is how they are matched to their items (and resent if their chunk is lost)
            while not self.progress.plan_done and len(self.waiting) - len(self.inherited) < self._window():
                item = next(items, None)
                if item is None:
                    self.progress.plan_done = True
                    break
                batch.append(item)
                if len(batch) >= self._chunk_size():
                    self._dispatch(batch)
                    batch = []
            if batch and (self.progress.plan_done or len(self.waiting) < self.slots):
                self._dispatch(batch)
                batch = []
            if self.progress.plan_done and not self.waiting and not batch:
                break
            self.collect(block=True)
            self._poll_chunks()
            self.checkpoint()
        self.checkpoint(force=True)
        return self.exit_code()

    def exit_code(self) -> int:
        if self.stopping:
            return EXIT_INTERRUPTED
        return EXIT_FAILED if self.progress.failed else EXIT_OK

    def _fresh(self, items: Iterator[dict[str, Any]], done: set[str]) -> Iterator[dict[str, Any]]:
        """Items not done and not dispatched before; duplicates reported once and dropped."""
        seen_twice: set[str] = set()
        pending: list[dict[str, Any]] = []

        def claim(batch: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
            """One SMISMEMBER for the batch. Ids join the SkipSet when their chunk is published."""
            if not batch:
                return
            known = self.client.smismember(self.key(RunPart.SKIP), [item["id"] for item in batch])
            fresh: set[str] = set()  # the SMISMEMBER answer is stale for ids yielded from this batch
            for item, was_known in zip(batch, known):
                item_id = item["id"]
                if not was_known and item_id not in self.claimed and item_id not in fresh:
                    self.claimed.add(item_id)
                    fresh.add(item_id)
                    yield item
                elif item_id in self.inherited:
                    self.inherited.discard(item_id)  # dispatched by an earlier driver: await it
                    self._inherited_items[item_id] = item
                elif item_id not in seen_twice:
                    seen_twice.add(item_id)
                    self.progress.duplicates += 1

        for item in items:
            if item["id"] in done:
                self.progress.skipped += 1
                continue
            pending.append(item)
            if len(pending) >= 500:
                yield from claim(pending)
                pending = []
        yield from claim(pending)

    def _window(self) -> int:
        """Items in flight at most: one per slot until an item's time is measured, then the window."""
        return self.slots if self.item_seconds is None else self.settings.window

    def _chunk_size(self) -> int:
        """About 100 ms of work per message, but enough messages to keep every slot busy."""
        if self.item_seconds is None:
            return 1
        by_time = int(0.1 / self.item_seconds) or 1
        return max(1, min(by_time, self.settings.max_chunk, max(1, self.settings.window // (2 * self.slots))))

    def _dispatch(self, batch: list[dict[str, Any]]) -> None:
        compute = (self.task_file.compute or Compute()).inherit(self.app.default_compute)
        policy = (
            RetryPolicy(max_retries=self.settings.retries, retry_on=RetryOn.TRANSIENT)
            if self.settings.retries
            else None
        )
        headers = Headers(compute=compute, policy=policy, sticky=self.settings.queue).encode()
        result = self.app.tasks[RUN_CHUNK_TASK].apply_async(
            args=(self.settings.run_id, batch),
            queue=self.settings.queue,
            headers=headers,
            argsrepr=f"({self.settings.run_id!r}, <{len(batch)} items>)",
            kwargsrepr="{}",
            tenant=self.settings.tenant,
        )
        ids = [item["id"] for item in batch]
        # after the publish: a crash in between may dispatch these ids again on resume (the result
        # cache keeps that from computing anything twice); before it, a crash would lose them
        self.client.sadd(self.key(RunPart.SKIP), *ids)
        self.claimed.difference_update(ids)
        self.chunks[result.id] = ids
        self._items[result.id] = batch
        self.waiting.update(ids)
        self.progress.dispatched += len(ids)
        self.progress.in_flight = len(self.waiting)

    def collect(self, block: bool) -> None:
        """Take the records workers handed over (waiting up to 0.2 s for one when ``block``)."""
        # LPOP with a count replies with a list, or nil when the list is empty (never one entry)
        lines = cast("list[bytes | str] | None", self.client.lpop(self.key(RunPart.READY), 5000))
        if not lines and block:
            popped = self.client.blpop([self.key(RunPart.READY)], timeout=0.2)
            lines = [popped[1]] if popped else []
        if lines:
            self.write(lines)

    def write(self, lines: Sequence[bytes | str], only_waiting: bool = True) -> list[Record]:
        """Sink encoded records and count them; returns those sunk. A record for an id no longer
        awaited (a redelivered chunk reporting twice) is dropped: each id lands once. A line that
        does not decode is skipped (logged and counted): its id stays awaited."""
        records: list[Record] = []
        for record in entries.decode_each("batch record", lines, decode):
            if only_waiting and record.id not in self.waiting:
                continue
            self.waiting.discard(record.id)
            if record.worker:  # a record the driver wrote (lost, cancelled) names no worker
                self.progress.per_worker[record.worker] += 1
            self.on_record(record)
            records.append(record)
            if isinstance(record, Ready):
                seconds = max(record.seconds or 0.0, 1e-6)
                self.item_seconds = seconds if self.item_seconds is None else 0.9 * self.item_seconds + 0.1 * seconds
        self.sink.write(records)
        self._sunk_ok.update(r.id for r in records if isinstance(r, Ready))
        failures = [r for r in records if isinstance(r, Failure)]
        self.progress.ok += len(records) - len(failures)
        self.progress.failed += sum(1 for r in failures if r.status in (FAILED, LOST))
        self.progress.cancelled += sum(1 for r in failures if r.status == CANCELLED)
        self.progress.in_flight = len(self.waiting)
        return records

    def _poll_chunks(self) -> None:
        """Twice a second: forget finished chunks, count retried ones' failures (quarantine) and
        resend lost ones. A chunk that fails for good has its items' records written by workers."""
        if time.monotonic() - self._last_poll < 0.5:
            return
        self._last_poll = time.monotonic()
        self._resend_lost_inherited()
        if not self.chunks:
            self.quarantine.decide()
            return
        ids = list(self.chunks)
        chunk_states = task_states(self.app, ids)
        ended: list[str] = []
        # retried or failed chunks, and every chunk that ends (a retry between two polls is seen
        # only in its history): their histories, in one round trip
        observed: list[str] = []
        for chunk_id, state in zip(ids, chunk_states):
            if state in (states.RETRY, states.FAILURE):
                observed.append(chunk_id)
            if not any(i in self.waiting for i in self.chunks[chunk_id]) and state in states.READY_STATES:
                if state != states.FAILURE:
                    observed.append(chunk_id)
                ended += self.chunks.pop(chunk_id)
                self._items.pop(chunk_id, None)
        self.quarantine.observe(observed)
        self._forget_successes(ended)
        self._give_up_on_ended(
            [
                i
                for i, state in zip(ids, chunk_states)
                if state in states.READY_STATES and any(item in self.waiting for item in self.chunks.get(i, ()))
            ]
        )
        unstarted = {i for i, state in zip(ids, chunk_states) if state is None and i in self.chunks}
        for chunk_id in self.lost_chunks.lost(unstarted):
            ids_left = [i for i in self.chunks.pop(chunk_id) if i in self.waiting]
            items = [item for item in self._items.pop(chunk_id, []) if item["id"] in ids_left]
            if items:
                self._dispatch(items)

    def _give_up_on_ended(self, chunk_ids: list[str]) -> None:
        """Chunks that ended with items still awaited, nothing left to collect, for ``ended_grace``
        seconds: no record of those items will come (one in Redis did not decode and was skipped,
        or the process that ended the chunk died before writing the failure records). Each is
        recorded lost, so the run ends and ``--resume`` runs it again."""
        now = time.monotonic()
        self._ended_at = {c: self._ended_at.get(c, now) for c in chunk_ids}
        due = [c for c, at in self._ended_at.items() if now - at >= self.ended_grace]
        if not due or self.client.llen(self.key(RunPart.READY)):
            return
        lines = [
            encode(
                Failure(
                    i,
                    LOST,
                    "RecordUnreadable",
                    f"chunk {c} ended, but no readable record of this "
                    "item reached the driver (see its log); --resume runs it again",
                    chunk=c,
                )
            )
            for c in due
            for i in self.chunks[c]
            if i in self.waiting
        ]
        self.write(lines)

    def _forget_successes(self, ids: list[str]) -> None:
        """Ended chunks' successes leave the result cache in one HDEL: the sink has them and no
        delivery of their chunks is left to skip them (failures stay, for resume to rerun or skip)."""
        ok = [i for i in ids if i in self._sunk_ok]
        if ok:
            self.client.hdel(self.key(RunPart.RESULTS), *ok)
            self._sunk_ok.difference_update(ok)

    def _resend_lost_inherited(self) -> None:
        """Ids an earlier driver dispatched, still awaited once no message of the run exists: send
        the ones plan() yielded again (the result cache keeps anything computed from running
        twice) and stop awaiting the ones it no longer yields."""
        if not self._inherited_items or not self.progress.plan_done:
            return
        orphans = self.waiting - set().union(*self.chunks.values())
        if not orphans or not self.lost_inherited.gone():
            return
        items = [self._inherited_items.pop(i) for i in sorted(orphans) if i in self._inherited_items]
        self.waiting -= orphans - {item["id"] for item in items}
        if items:
            self._dispatch(items)

    def checkpoint(self, force: bool = False) -> None:
        """Replace checkpoint.json (at most once a second unless ``force``) and report progress."""
        if force or time.monotonic() - self._last_checkpoint >= 1.0:
            self._last_checkpoint = time.monotonic()
            self.sink.checkpoint({"run_id": self.settings.run_id, **self.progress.as_dict()})
            self.on_progress(self.progress)

    def interrupt(self) -> None:
        """Ctrl-C: stop dispatching; workers record their unstarted items as cancelled."""
        self.stopping = True
        self.client.set(self.key(RunPart.CANCEL), 1)
