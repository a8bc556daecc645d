"""10,000 no-op tasks through sluice and through stock Celery with its defaults (what a user would
pick instead: early acks, prefetch 4, no sent events): same redis-server, same worker (prefork,
-c 2), run one after the other, alternated. A third kind, ``intake``, is the same sluice worker
fed by a plain Celery client publishing to Celery's default queue: every task goes through the
intake and is forwarded (admission) to the cpu class before it runs.

Prints one JSON line: tasks/s for each, the ratio sluice/stock (goal: >= 0.9) and the ratio
intake/direct (what the forward costs).
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

ROOT = Path(__file__).resolve().parent.parent


def run_round(kind: str, tasks: int, env: dict[str, str],
              window: Callable[[], AbstractContextManager[object]] = nullcontext) -> float:
    """Start one worker, push ``tasks`` no-ops through it, return tasks/s end to end; ``window``
    is entered around the timed part only (bench/redis_cost.py reads Redis's counters there)."""
    from bench import apps

    app, task = (apps.sluice_app, apps.noop) if kind == "sluice" else (apps.plain_app, apps.plain_noop)
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
            ids = [task.delay().id for _ in range(tasks)]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from sluice.deploy.embedded import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp)) as server:
        os.environ["SLUICE_BROKER_URL"] = server.url
        env = os.environ | {"PYTHONPATH": str(ROOT)}
        rates: dict[str, list[float]] = {"plain": [], "sluice": [], "intake": []}
        for _ in range(args.rounds):
            for kind in rates:
                rates[kind].append(run_round(kind, args.tasks, env))
    plain, ours, intake = (statistics.median(rates[kind]) for kind in ("plain", "sluice", "intake"))
    print(json.dumps({"benchmark": "throughput", "tasks": args.tasks, "rounds": args.rounds,
                      "stock_celery_tasks_per_s": round(plain, 1), "sluice_tasks_per_s": round(ours, 1),
                      "ratio": round(ours / plain, 3), "goal_ratio": 0.9,
                      "sluice_via_intake_tasks_per_s": round(intake, 1), "intake_vs_direct": round(intake / ours, 3)}))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
