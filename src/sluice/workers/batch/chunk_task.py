"""The worker side of a batch run: execute a chunk of items, caching each record in Redis.

Records reach Redis before the chunk's message is acknowledged (flushed at least every 50 ms,
so a slow item's result is durable as soon as it ends). A retried or redelivered chunk skips
items whose records are already cached: nothing computed is computed again. The task file runs
only once its signature holds (:meth:`TaskFile.unsealed`); a chunk of a run whose task file is
unsigned, or signed with another secret, fails with InvalidRequestError, and its items get
failure records that say why.
"""

from __future__ import annotations

import time
from typing import Any

from sluice import keys
from sluice.headers import attempt_of
from sluice.keys import RunPart
from sluice.tasks.batch import RUN_CHUNK_TASK
from sluice.tasks.batch.records import Failure, encode, execute_item
from sluice.tasks.batch.taskfile import TaskFile

FLUSH_SECONDS = 0.05
_task_files: dict[str, TaskFile] = {}


def task_file(app: Any, run_id: str) -> TaskFile:
    """The run's task file, built from the signed source the driver stored in Redis (cached per
    process once its signature held)."""
    loaded = _task_files.get(run_id)
    if loaded is None:
        stored = app.redis.hgetall(keys.run(run_id, RunPart.SOURCE))
        loaded = _task_files[run_id] = TaskFile.unsealed(run_id, stored, app.settings.signing_secret())
    return loaded


def run_chunk(task: Any, run_id: str, items: list[dict[str, Any]]) -> int:
    """Bound Celery task body (every sluice App registers it under ``RUN_CHUNK_TASK``)."""
    client = task.app.redis
    loaded = task_file(task.app, run_id)
    worker = task.app.node_name(task.request)
    attempt = attempt_of(task.request)
    cached = client.hmget(keys.run(run_id, RunPart.RESULTS), [item["id"] for item in items])
    pending: list[tuple[str, str]] = []
    last_flush = time.monotonic()
    for item, done in zip(items, cached):
        if done is not None:
            continue
        pending.append(execute_item(loaded.execute, item, worker, attempt))
        if time.monotonic() - last_flush >= FLUSH_SECONDS:
            if _flush(client, run_id, pending):
                break  # Ctrl-C on the driver: leave the rest unstarted (the driver records them cancelled)
            last_flush = time.monotonic()
    _flush(client, run_id, pending)
    return len(items)


def _flush(client: Any, run_id: str, records: list[tuple[str, str]]) -> bool:
    """Write records to the result cache, then hand them to the driver; returns whether the run
    was cancelled. The cache is the durable copy; the ``ready`` list carries the same lines."""
    pipe = client.pipeline(transaction=False)
    if records:
        pipe.hset(keys.run(run_id, RunPart.RESULTS), mapping=dict(records))
        pipe.rpush(keys.run(run_id, RunPart.READY), *[line for _, line in records])
    pipe.exists(keys.run(run_id, RunPart.CANCEL))
    cancelled = bool(pipe.execute()[-1])
    records.clear()
    return cancelled


def record_chunk_failure(
    sender: Any = None, task_id: str = "", exception: BaseException | None = None, args: Any = None, **_: Any
) -> None:
    """A chunk that failed for good (its worker lost, retries spent): every item of it without a
    record gets a failure record, so no accepted item is left waiting. Celery sends this signal
    from whichever process ended the task (pool process or main process)."""
    if getattr(sender, "name", None) != RUN_CHUNK_TASK or not args:
        return
    run_id, items = args[0], args[1]
    client = sender.app.redis
    results = keys.run(run_id, RunPart.RESULTS)
    ids = [item["id"] for item in items]
    missing = [i for i, done in zip(ids, client.hmget(results, ids)) if done is None]
    if not missing:
        return
    lines = {i: encode(Failure.of_chunk(i, exception, task_id)) for i in missing}
    pipe = client.pipeline(transaction=False)
    pipe.hset(results, mapping=lines)
    pipe.rpush(keys.run(run_id, RunPart.READY), *lines.values())
    pipe.execute()
