"""The batch-run driver behind ``sluice compute``.

It streams ``plan()`` lazily with a bounded in-flight window, dispatches each id at most once per
run (the SkipSet, a Redis set), packs items into chunks whose size adapts to how long items take
(per-message overhead is what limits tiny items), and moves records from the Redis result cache
to the sink. On resume it takes what the cache already holds, skips what the sink holds, and
waits for what earlier drivers dispatched instead of dispatching it again.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import states

from sluice import _kombu, keys
from sluice.app import App
from sluice.client.batch.sink import Sink
from sluice.client.batch.taskfile import TaskFile
from sluice.compute import Compute
from sluice.headers import Headers
from sluice.tasks.history import read as read_history
from sluice.tasks.retry import RetryOn, RetryPolicy
from sluice.workers.batch.chunk_task import RUN_CHUNK_TASK

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


@dataclass
class Progress:
    """Counts a run shows while it goes and writes to checkpoint.json."""

    started: float = field(default_factory=time.time)
    ok: int = 0
    failed: int = 0
    cancelled: int = 0
    skipped: int = 0
    duplicates: int = 0
    dispatched: int = 0
    in_flight: int = 0
    plan_done: bool = False
    per_worker: Counter[str] = field(default_factory=Counter)
    quarantined: list[str] = field(default_factory=list)

    @property
    def finished(self) -> int:
        return self.ok + self.failed + self.cancelled

    def rate(self) -> float:
        return self.finished / max(time.time() - self.started, 1e-9)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "failed": self.failed, "cancelled": self.cancelled, "skipped": self.skipped,
                "duplicates": self.duplicates, "dispatched": self.dispatched, "in_flight": self.in_flight,
                "plan_done": self.plan_done, "items_per_s": round(self.rate(), 1),
                "elapsed_s": round(time.time() - self.started, 3), "per_worker": dict(self.per_worker),
                "quarantined": self.quarantined, "updated": time.time()}


@dataclass
class RunSettings:
    run_id: str
    queue: str
    retries: int = 0
    window: int = 20_000
    max_chunk: int = 1_000
    quarantine_after: int = 3
    rerun_failed: bool = False


class Driver:
    def __init__(self, app: App, task_file: TaskFile, sink: Sink, settings: RunSettings, slots: int,
                 on_record: Callable[[dict[str, Any]], None] = lambda record: None,
                 on_progress: Callable[[Progress], None] = lambda progress: None) -> None:
        self.app, self.task_file, self.sink, self.settings = app, task_file, sink, settings
        self.slots = max(slots, 1)
        self.on_record = on_record
        self.on_progress = on_progress
        self.client = app.redis
        self.layout = _kombu.RedisLayout.of_app(app)
        self.progress = Progress()
        self.chunks: dict[str, list[str]] = {}           # chunk task id -> item ids without a record yet
        self.waiting: set[str] = set()                   # ids in flight (this driver's or an earlier one's)
        self.inherited: set[str] = set()                 # ids an earlier driver of this run dispatched
        self.claimed: set[str] = set()                   # ids taken from plan(), not yet published
        self.item_seconds: float | None = None           # moving average of execute() time (None: unknown)
        self.infra_failures: Counter[str] = Counter()
        self.stopping = False
        self._seen_attempts: set[tuple[str, int]] = set()
        self._suspects: set[str] = set()
        self._items: dict[str, list[dict[str, Any]]] = {}  # chunk id -> its items, to resend a lost chunk
        self._last_lost_check = time.monotonic()
        self._last_checkpoint = 0.0
        self._last_poll = 0.0

    def key(self, part: str) -> str:
        return keys.run(self.settings.run_id, part)

    # --- set-up -----------------------------------------------------------------------------

    def publish_source(self) -> None:
        """Cluster workers load the task file from here: they need no copy of it."""
        tf = self.task_file
        self.client.hset(self.key("source"), mapping={"filename": tf.filename, "source": tf.source,
                                                      "argv": json.dumps(tf.argv)})
        self.client.delete(self.key("cancel"))

    def reset(self) -> None:
        """A fresh run under a name used before: forget that run's dispatches and results."""
        self.client.delete(*(self.key(part) for part in ("skip", "results", "ready", "cancel")))

    def recover(self, done: set[str]) -> None:
        """Resume: sink what the cache computed meanwhile; wait for what earlier drivers dispatched."""
        lines, rerun = [], []
        for raw_id, raw in self.client.hscan_iter(self.key("results"), count=5000):
            item_id = raw_id.decode()
            if self.settings.rerun_failed and b'"status": "failed"' in raw:
                rerun.append(item_id)            # --rerun-failed: forget the failure, dispatch it again
            elif item_id not in done:
                lines.append(raw)
                done.add(item_id)
        if rerun:
            self.client.hdel(self.key("results"), *rerun)
            self.client.srem(self.key("skip"), *rerun)
        self._write(lines, only_waiting=False)
        self.client.delete(self.key("ready"))
        for raw_id in self.client.sscan_iter(self.key("skip"), count=5000):
            if raw_id.decode() not in done:
                self.inherited.add(raw_id.decode())
        self.waiting |= self.inherited

    # --- the loop -----------------------------------------------------------------------------

    def run(self, done: set[str]) -> int:
        self.publish_source()
        self.recover(done)
        self.progress.in_flight = len(self.waiting)
        items = self._fresh(self.task_file.plan(), done)
        batch: list[dict[str, Any]] = []
        while not self.stopping:
            while not self.progress.plan_done and len(self.waiting) < self._window():
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
            self._collect(block=True)
            self._poll_chunks()
            self._checkpoint()
        self._checkpoint(force=True)
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
            known = self.client.smismember(self.key("skip"), [item["id"] for item in batch])
            fresh: set[str] = set()   # the SMISMEMBER answer is stale for ids yielded from this batch
            for item, was_known in zip(batch, known):
                item_id = item["id"]
                if not was_known and item_id not in self.claimed and item_id not in fresh:
                    self.claimed.add(item_id)
                    fresh.add(item_id)
                    yield item
                elif item_id in self.inherited:
                    self.inherited.discard(item_id)      # dispatched by an earlier driver: await it
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
        policy = (RetryPolicy(max_retries=self.settings.retries, retry_on=RetryOn.TRANSIENT)
                  if self.settings.retries else None)
        headers = Headers(compute=compute, policy=policy, sticky=self.settings.queue).encode()
        result = self.app.tasks[RUN_CHUNK_TASK].apply_async(
            args=(self.settings.run_id, batch), queue=self.settings.queue, headers=headers,
            argsrepr=f"({self.settings.run_id!r}, <{len(batch)} items>)", kwargsrepr="{}")
        ids = [item["id"] for item in batch]
        # after the publish: a crash in between may dispatch these ids again on resume (the result
        # cache keeps that from computing anything twice); before it, a crash would lose them
        self.client.sadd(self.key("skip"), *ids)
        self.claimed.difference_update(ids)
        self.chunks[result.id] = ids
        self._items[result.id] = batch
        self.waiting.update(ids)
        self.progress.dispatched += len(ids)
        self.progress.in_flight = len(self.waiting)

    def _collect(self, block: bool) -> None:
        lines = self.client.lpop(self.key("ready"), 5000)
        if not lines and block:
            popped = self.client.blpop([self.key("ready")], timeout=0.2)
            lines = [popped[1]] if popped else []
        if lines:
            self._write(lines)

    def _write(self, lines: list[bytes | str], only_waiting: bool = True) -> None:
        """Sink records (JSON lines; failures carry a "status") and count them. A record for an id
        no longer awaited (a redelivered chunk reporting twice) is dropped: each id lands once."""
        ready, failures = [], []
        for line in lines:
            record = json.loads(line)
            if only_waiting and record["id"] not in self.waiting:
                continue
            self.waiting.discard(record["id"])
            self.progress.per_worker[record.get("worker") or "?"] += 1
            self.on_record(record)
            if "status" in record:
                failures.append(record)
            else:
                ready.append(record)
                seconds = max(record.get("seconds") or 0.0, 1e-6)
                self.item_seconds = seconds if self.item_seconds is None else 0.9 * self.item_seconds + 0.1 * seconds
        self.sink.write(ready, failures)
        self.progress.ok += len(ready)
        self.progress.failed += sum(1 for r in failures if r["status"] == "failed")
        self.progress.cancelled += sum(1 for r in failures if r["status"] == "cancelled")
        self.progress.in_flight = len(self.waiting)

    def _poll_chunks(self) -> None:
        """Count infrastructure failures per worker from retried chunks (for quarantine). A chunk
        that fails for good has its items' failure records written by the worker side."""
        if time.monotonic() - self._last_poll < 0.5 or not self.chunks:
            return
        self._last_poll = time.monotonic()
        ids = list(self.chunks)
        metas = self.client.mget([_kombu.task_meta_key(self.app, i) for i in ids])
        for chunk_id, raw in zip(ids, metas):
            if not any(i in self.waiting for i in self.chunks[chunk_id]):
                del self.chunks[chunk_id]
                self._items.pop(chunk_id, None)
                continue
            if raw and json.loads(raw)["status"] in (states.RETRY, states.FAILURE):
                self._count_infra_failures(chunk_id)
        self._redispatch_lost({i for i, raw in zip(ids, metas) if raw is None and i in self.chunks})

    def _redispatch_lost(self, pending: set[str]) -> None:
        """A chunk never started and found in no queue, twice 10 s apart, was lost (a worker killed
        between taking it from the list and recording it as held): send its items again."""
        if time.monotonic() - self._last_lost_check < 10:
            return
        self._last_lost_check = time.monotonic()
        held = [item.task_id for item in self.layout.held(self.client)]
        queued = [json.loads(raw) for _, raw in self.layout.waiting(self.client, self.settings.queue)]
        present = {*held, *(m.get("headers", {}).get("id") for m in queued)}
        lost = pending - present
        for chunk_id in lost & self._suspects:
            ids = [i for i in self.chunks.pop(chunk_id) if i in self.waiting]
            raw_items = self._items.pop(chunk_id, [])
            items = [item for item in raw_items if item["id"] in ids]
            if items:
                self._dispatch(items)
        self._suspects = lost

    def wait_for_acks(self, timeout: float = 5.0) -> bool:
        """After the last record: wait until no message of this run is held unacknowledged (a
        worker acknowledges a chunk just after caching its records), so that its workers can be
        stopped at once instead of warmly. False if some message is still held at ``timeout``."""
        tag = f".{self.settings.run_id[:8]}@"  # in this run's local workers' own queues (sticky retries)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                keys_held = [item.queue for item in self.layout.held(self.client)]
            except redis.RedisError:
                return False  # cannot tell: stop them warmly
            if not any(k == self.settings.queue or tag in k for k in keys_held):
                return True
            time.sleep(0.01)
        return False

    def _count_infra_failures(self, chunk_id: str) -> None:
        for attempt in read_history(self.client, chunk_id):
            marker = (chunk_id, attempt["attempt"])
            if marker in self._seen_attempts:
                continue
            self._seen_attempts.add(marker)
            worker = attempt["worker"]
            self.infra_failures[worker] += 1
            healthy = set(self.progress.per_worker) - set(self.progress.quarantined) - {worker}
            if (self.infra_failures[worker] >= self.settings.quarantine_after
                    and worker not in self.progress.quarantined and healthy):  # never the last worker
                self.progress.quarantined.append(worker)
                self.app.control.cancel_consumer(self.settings.queue, destination=[worker])

    def _checkpoint(self, force: bool = False) -> None:
        if force or time.monotonic() - self._last_checkpoint >= 1.0:
            self._last_checkpoint = time.monotonic()
            self.sink.checkpoint({"run_id": self.settings.run_id, **self.progress.as_dict()})
            self.on_progress(self.progress)

    # --- Ctrl-C -------------------------------------------------------------------------------

    def interrupt(self) -> None:
        """Stop dispatching; workers record their unstarted items as cancelled."""
        self.stopping = True
        self.client.set(self.key("cancel"), 1)

    def finish_interrupted(self, private_queue: bool) -> None:
        """After the workers stopped: take what they wrote; record every other in-flight id as
        cancelled and forget it was dispatched (resume runs it again); drop its messages."""
        while self.client.llen(self.key("ready")):
            self._collect(block=False)
        self.app.control.revoke(list(self.chunks))
        if private_queue:
            self._drop_queue()
        if self.waiting:
            self.client.srem(self.key("skip"), *self.waiting)
        self._write([json.dumps({"id": i, "status": "cancelled", "error": "Cancelled",
                                 "message": "the run was interrupted (Ctrl-C) before this item finished",
                                 "traceback": "", "worker": None}) for i in sorted(self.waiting)])
        self._checkpoint(force=True)

    def _drop_queue(self) -> None:
        """The run-private queue's waiting and held messages (its workers are gone)."""
        self.client.delete(*self.layout.queue_lists(self.settings.queue))
        self.layout.drop_held(self.client, self.settings.queue)
