"""Time from an attempt's death to the escalated attempt starting, for the three ways to die:
(a) the watchdog kills the pool process, (b) something else SIGKILLs it, (c) the whole worker
dies (SIGKILL of its process group, as an OOMKilled pod) and a surviving worker recovers the
message through heartbeats and the delivery ledger, with the default settings (heartbeat every
2 s, dead after 5 missed beats, orphan sweep every 5 s). Prints one JSON line.

Usage: python bench/escalation.py [--runs 20] [--worker-deaths 5]
Goals: (a) and (b) median under 1 s; (c) under 60 s (Celery alone waits for the visibility timeout).
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
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
QUEUES = ("--queue", "small", "--queue", "medium", "--queue", "large")


def start_worker(env: dict[str, str]) -> tuple[str, subprocess.Popen[bytes]]:
    name = f"bench-{uuid.uuid4().hex[:6]}@bench"
    process = subprocess.Popen(
        [sys.executable, "-m", "sluice", "worker", "-A", "bench.escalation_app", *QUEUES, "-c", "2", "-n", name,
         "--without-mingle", "--without-gossip", "--loglevel", "WARNING"],
        cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return name, process


def wait_key(client: redis.Redis, key: str, timeout: float = 120) -> bytes:
    """Poll every 10 ms (the figure's resolution) until ``key`` exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = client.get(key)
        if value is not None:
            return value
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {key}")


def figures(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_s": round(statistics.median(ordered), 3),
            "p95_s": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3), "n": len(ordered)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="kills of each kind (a) and (b)")
    parser.add_argument("--worker-deaths", type=int, default=5, help="whole-worker kills (c)")
    args = parser.parse_args()
    from sluice.deploy.embedded import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp)) as server:
        os.environ["SLUICE_BROKER_URL"] = server.url
        env = os.environ | {"PYTHONPATH": str(ROOT)}
        sys.path.insert(0, str(ROOT))
        from bench import escalation_app as bench_app

        client = server.client()
        workers = [start_worker(env), start_worker(env)]
        try:
            watchdog, sigkill, death = [], [], []
            for _ in range(args.runs):
                result = bench_app.hog.delay()
                start2 = float(wait_key(client, f"bench:start:{result.id}:2"))
                killed_at = json.loads(client.get(f"sluice:memkill:{result.id}"))["at"]
                watchdog.append(start2 - killed_at)
                result = bench_app.sigkill.delay()
                start2 = float(wait_key(client, f"bench:start:{result.id}:2"))
                sigkill.append(start2 - float(client.get(f"bench:killed:{result.id}")))
            for _ in range(args.worker_deaths):
                result = bench_app.steady.delay()
                host = wait_key(client, f"bench:host:{result.id}").decode()
                victim = next(w for w in workers if w[0] == host)
                killed_at = time.time()
                os.killpg(victim[1].pid, signal.SIGKILL)
                victim[1].wait()
                workers.remove(victim)
                workers.append(start_worker(env))  # the replacement pod, under a new name
                death.append(float(wait_key(client, f"bench:start:{result.id}:2", timeout=300)) - killed_at)
        finally:
            for _, process in workers:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    print(json.dumps({"benchmark": "escalation", "kill_to_escalated_start": {
        "a_watchdog_kill": figures(watchdog), "b_sigkill": figures(sigkill), "c_worker_death": figures(death)},
        "goals_s": {"a_watchdog_kill": 1.0, "b_sigkill": 1.0, "c_worker_death": 60.0}}))


if __name__ == "__main__":
    main()
