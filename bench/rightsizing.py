"""Right-sizing: one 8Gi worker, a mixed workload (tasks whose real peaks range 100Mi to 1000Mi,
declared at about twice that, as users do; each runs ``--seconds`` in all, touching its memory
included), run three ways: (a) fixed slots sized by the largest declaration (2Gi, four of them),
(b) one packed class with the declared sizes, (c) the packed class with ``memory="auto"`` (after
a warm-up of ``auto_min_runs`` runs per task, which is timed apart). Prints one JSON line: per
mode wall time, mean memory reserved per task against its real peak, mean use of the worker's
memory, memory kills and worker deaths.

Usage: python bench/rightsizing.py [--tasks 200] [--seconds 3]
Goals: (c) at least 3x faster than (a), reserving within 1.5x of real peaks, no worker death.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKER_BYTES = 8 << 30


def run_mode(mode: str, tasks: int, seconds: float, env: dict[str, str]) -> dict[str, Any]:
    from bench import rightsizing_app
    from sluice import App, keys
    from sluice.deploy.embedded import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp)) as server:
        env = env | {"SLUICE_BROKER_URL": server.url, "BENCH_RIGHTSIZING_MODE": mode}
        classes = rightsizing_app.classes(mode)
        name = f"work-{uuid.uuid4().hex[:6]}@bench"
        worker = subprocess.Popen(
            [sys.executable, "-m", "sluice", "worker", "-A", "bench.rightsizing_app", "--queue", "work", "-n", name,
             "--without-mingle", "--without-gossip", "--loglevel", "WARNING"],
            cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = server.client()
        try:
            deadline = time.monotonic() + 60
            while not client.exists(keys.worker_heartbeat(name)):
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise SystemExit(f"{mode}: the worker did not start")
                time.sleep(0.1)
            names = [f"bench.rightsizing.use_{mib}" for mib in rightsizing_app.SIZES]
            warmup = 0.0
            if mode == "learned":
                sender = App("bench.sender", broker=server.url, classes=classes)
                started = time.perf_counter()
                for result in [sender.send_task(n, args=(seconds,)) for n in names for _ in range(5)]:
                    result.get(timeout=600)
                warmup = time.perf_counter() - started
                time.sleep(0.5)   # the last runs' peaks land on the watchdog's next tick
            sender = App("bench.sender", broker=server.url, classes=classes)   # a fresh profile cache
            workload = [random.Random(i).choice(names) for i in range(tasks)]
            started = time.perf_counter()
            outcomes = [r.get(timeout=1800) for r in [sender.send_task(n, args=(seconds,)) for n in workload]]
            wall = time.perf_counter() - started
            kills = int(client.get(keys.stat("memory_kills", "work")) or 0)
            died = worker.poll() is not None
        finally:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    reserved = sum(o["reserved"] for o in outcomes) / len(outcomes)
    peak = sum(o["peak"] for o in outcomes) / len(outcomes)
    used = sum(o["peak"] * (o["end"] - o["start"]) for o in outcomes)
    edges = sorted([(o["start"], 1) for o in outcomes] + [(o["end"], -1) for o in outcomes])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return {"wall_s": round(wall, 1), "warmup_s": round(warmup, 1) if warmup else None,
            "mean_reserved_mib": round(reserved / 2**20), "mean_real_peak_mib": round(peak / 2**20),
            "reserved_over_real": round(reserved / peak, 2), "worker_memory_use": round(used / (WORKER_BYTES * wall), 3),
            "most_at_once": most, "memory_kills": kills, "worker_deaths": int(died)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each task runs, touching its memory included")
    args = parser.parse_args()
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    modes = {mode: run_mode(mode, args.tasks, args.seconds, env) for mode in ("fixed", "packed", "learned")}
    print(json.dumps({"benchmark": "rightsizing", "tasks": args.tasks, "seconds": args.seconds, **modes,
                      "learned_speedup_over_fixed": round(modes["fixed"]["wall_s"] / modes["learned"]["wall_s"], 2),
                      "goals": {"learned_speedup_over_fixed": 3.0, "reserved_over_real": 1.5, "worker_deaths": 0}}))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
