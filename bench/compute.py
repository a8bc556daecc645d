"""`sluice compute` throughput and resume cost, side by side with the alternatives, in one run.

* 10,000 no-op items with ``-w 2`` (two local workers, one slot each), end to end (worker start
  included) and in steady state (from the checkpoint's first to last result);
* the same items through ``multiprocessing.Pool(2).map``;
* the same count of no-op tasks as a plain Celery ``group`` on the same Redis, 2 prefork slots;
* resume with 1,000,000 ids already in the sink: seconds to read the sink and skip them all;
* Redis memory: a no-op run of 300,000 and of 1,000,000 items with ``-w 2`` on a fresh
  redis-server, its ``used_memory_peak`` over what it used before, per item.

Prints one JSON line. Goals: >= 5,000 items/s with -w 2; skipping 1M done ids in under 3 s;
<= 150 bytes of Redis peak memory per item.
Usage: python bench/compute.py [--items 10000] [--resume-ids 1000000] [--memory-items 300000 1000000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "bench" / "noop_task.py"


def noop(item: dict) -> dict:
    return {}


def sluice_run(items: int, home: Path) -> dict[str, float]:
    sink = home / "sink"
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_BROKER_URL"} | {"SLUICE_HOME": str(home)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sluice", "compute", str(TASK), "-w", "2", "--sink", str(sink),
                    "--results", "quiet", "--", "--n", str(items)], check=True, env=env, timeout=600)
    wall = time.perf_counter() - start
    started = sorted(json.loads(line)["started"] for line in open(sink / "ready.ndjson"))
    return {"sluice_items_per_s_end_to_end": round(items / wall, 1),
            "sluice_items_per_s_steady": round(items / max(started[-1] - started[0], 1e-9), 1)}


def pool_run(items: int) -> float:
    work = [{"id": f"i{i}"} for i in range(items)]
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(noop, work)
    return round(items / (time.perf_counter() - start), 1)


def celery_group_run(items: int, home: Path) -> float:
    from sluice.deploy.embedded import EmbeddedRedis

    with EmbeddedRedis(home / "celery-redis") as server:
        env = os.environ | {"SLUICE_BROKER_URL": server.url, "PYTHONPATH": str(ROOT)}
        os.environ["SLUICE_BROKER_URL"] = server.url
        sys.path.insert(0, str(ROOT))
        from celery import group

        from bench import apps

        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "bench.apps:plain_app", "worker",
                                   "-c", "2", "--without-mingle", "--without-gossip", "--loglevel", "WARNING"],
                                  cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            apps.plain_noop.delay().get(timeout=60)
            start = time.perf_counter()
            group(apps.plain_noop.s() for _ in range(items)).apply_async().get(timeout=600)
            return round(items / (time.perf_counter() - start), 1)
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(60)


def resume_skip(ids: int, home: Path) -> float:
    """Read a sink of ``ids`` done ids and skip a plan of the same ids (what --resume does first)."""
    from sluice.client.batch.sink import Sink
    from sluice.tasks.batch.taskfile import TaskFile

    sink_dir = home / "resume"
    sink_dir.mkdir()
    with open(sink_dir / "ready.ndjson", "w") as out:
        out.writelines(json.dumps({"id": f"i{i}", "result": {}, "worker": "w", "attempts": 1, "started": 0.0,
                                   "seconds": 0.0}) + "\n" for i in range(ids))
    start = time.perf_counter()
    done = Sink(sink_dir).open().done_ids()
    task = TaskFile.load(TASK, ["--n", str(ids)])
    remaining = sum(1 for item in task.plan() if item["id"] not in done)
    elapsed = time.perf_counter() - start
    assert remaining == 0
    return round(elapsed, 3)


def redis_peak_per_item(items: int, home: Path) -> float:
    """Bytes of a fresh Redis's ``used_memory_peak`` (over its ``used_memory`` before) per item of
    a ``-w 2`` no-op run on it: what a run keeps in Redis (SkipSet, result cache, messages)."""
    from sluice.deploy.embedded import EmbeddedRedis

    with EmbeddedRedis(home / f"memory-redis-{items}") as server:
        client = server.client()
        before = client.info("memory")["used_memory"]
        env = {k: v for k, v in os.environ.items() if k != "SLUICE_BROKER_URL"} | {"SLUICE_HOME": str(home)}
        subprocess.run([sys.executable, "-m", "sluice", "compute", str(TASK), "-w", "2", "--broker", server.url,
                        "--sink", str(home / f"memory-sink-{items}"), "--results", "quiet", "--", "--n", str(items)],
                       check=True, env=env, timeout=3600)
        return round((client.info("memory")["used_memory_peak"] - before) / items, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--resume-ids", type=int, default=1_000_000)
    parser.add_argument("--memory-items", type=int, nargs="*", default=[300_000, 1_000_000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        figures = sluice_run(args.items, home)
        figures["multiprocessing_pool2_items_per_s"] = pool_run(args.items)
        figures["celery_group_items_per_s"] = celery_group_run(args.items, home)
        figures["ratio_vs_celery_group"] = round(figures["sluice_items_per_s_end_to_end"]
                                                 / figures["celery_group_items_per_s"], 2)
        figures["resume_skip_s"] = resume_skip(args.resume_ids, home)
        figures["redis_peak_bytes_per_item"] = {n: redis_peak_per_item(n, home) for n in args.memory_items}
    print(json.dumps({"benchmark": "compute", "items": args.items, "resume_ids": args.resume_ids, **figures,
                      "goals": {"sluice_items_per_s": 5000, "resume_skip_s": 3.0, "redis_peak_bytes_per_item": 150}}))


if __name__ == "__main__":
    main()
