"""10,000 no-op tasks through sluice and through stock Celery with its defaults (what a user would
pick instead: early acks, prefetch 4, no sent events): same redis-server, same worker (prefork,
-c 2), run one after the other, alternated. ``intake`` is the same sluice worker fed by a plain
Celery client publishing to Celery's default queue: every task goes through the intake and is
forwarded (admission) to the cpu class before it runs. ``bulk`` is sluice with the tasks
submitted by one ``delay_many`` instead of a ``.delay()`` loop.

Then enqueue alone (no worker): a ``.delay()`` loop on stock Celery and on sluice, and sluice's
``delay_many``, alternated.

Prints one JSON line: tasks/s end to end for each kind, the ratio sluice/stock (goal: >= 1.0),
intake/direct (what the forward costs), and calls/s enqueued for each way with the ratio of
delay_many to stock Celery's ``.delay()`` loop (goal: >= 10).
Usage: python bench/throughput.py [--tasks 10000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_round(kind: str, tasks: int, env: dict[str, str],
              window: Callable[[], AbstractContextManager[object]] = nullcontext) -> float:
    """Start one worker, push ``tasks`` no-ops through it, return tasks/s end to end; ``window``
    is entered around the timed part only (bench/redis_cost.py reads Redis's counters there)."""
    from bench import apps

    app, task = _app_and_task(kind)
    client = apps.sluice_app.redis
    client.flushdb()
    cmd = ([sys.executable, "-m", "celery", "-A", "bench.apps:plain_app", "worker", "-Q", "celery"] if kind == "plain"
           else [sys.executable, "-m", "sluice", "worker", "-A", "bench.apps:sluice_app", "--queue", "cpu"])
    worker = subprocess.Popen([*cmd, "-c", "2", "-P", "prefork", "--without-mingle", "--without-gossip",
                               "--loglevel", "WARNING", "-n", f"{kind}@bench"],
                              cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        task.delay().get(timeout=60)  # warm: the worker is up and consuming
        with window():
            start = time.perf_counter()
            ids = submit(kind, task, tasks)
            keys = [app.backend.get_key_for_task(i) for i in ids]  # the result keys, as Celery names them
            pending = keys
            deadline = time.monotonic() + 600
            while pending and time.monotonic() < deadline:
                found = client.mget(pending)
                pending = [k for k, v in zip(pending, found) if v is None]
                if pending:
                    time.sleep(0.05)
            elapsed = time.perf_counter() - start
        if pending:
            raise SystemExit(f"{kind}: {len(pending)} tasks unfinished after 600 s")
        return tasks / elapsed
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)
        del app


def _app_and_task(kind: str) -> tuple[Any, Any]:
    from bench import apps

    return (apps.sluice_app, apps.noop) if kind in ("sluice", "bulk") else (apps.plain_app, apps.plain_noop)


def submit(kind: str, task: Any, tasks: int) -> list[str]:
    """The task ids of ``tasks`` calls, by one delay_many (``bulk``) or a ``.delay()`` loop."""
    if kind == "bulk":
        return task.delay_many([()] * tasks, progress=False).ids
    return [task.delay().id for _ in range(tasks)]


def enqueue_rate(kind: str, tasks: int) -> float:
    """Calls/s of submitting ``tasks`` calls with no worker running."""
    from bench import apps

    _, task = _app_and_task(kind)
    apps.sluice_app.redis.flushdb()
    start = time.perf_counter()
    submit(kind, task, tasks)
    elapsed = time.perf_counter() - start
    apps.sluice_app.redis.flushdb()
    return tasks / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from sluice.deploy.embedded import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp)) as server:
        os.environ["SLUICE_BROKER_URL"] = server.url
        env = os.environ | {"PYTHONPATH": str(ROOT)}
        rates: dict[str, list[float]] = {"plain": [], "sluice": [], "intake": [], "bulk": []}
        enqueued: dict[str, list[float]] = {"plain": [], "sluice": [], "bulk": []}
        for _ in range(args.rounds):
            for kind in rates:
                rates[kind].append(run_round(kind, args.tasks, env))
        for _ in range(args.rounds):
            for kind in enqueued:
                enqueued[kind].append(enqueue_rate(kind, args.tasks))
    plain, ours, intake, bulk = (statistics.median(rates[kind]) for kind in ("plain", "sluice", "intake", "bulk"))
    put = {kind: statistics.median(values) for kind, values in enqueued.items()}
    print(json.dumps({"benchmark": "throughput", "tasks": args.tasks, "rounds": args.rounds,
                      "stock_celery_tasks_per_s": round(plain, 1), "sluice_tasks_per_s": round(ours, 1),
                      "ratio": round(ours / plain, 3), "goal_ratio": 1.0,
                      "sluice_via_intake_tasks_per_s": round(intake, 1), "intake_vs_direct": round(intake / ours, 3),
                      "sluice_bulk_submitted_tasks_per_s": round(bulk, 1),
                      "enqueue_stock_celery_delay_per_s": round(put["plain"], 1),
                      "enqueue_sluice_delay_per_s": round(put["sluice"], 1),
                      "enqueue_sluice_delay_many_per_s": round(put["bulk"], 1),
                      "delay_many_vs_stock_delay": round(put["bulk"] / put["plain"], 2), "goal_delay_many": 10}))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
