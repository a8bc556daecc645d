"""Sharing one class between tenants, measured with a real worker (one class of 4 slots, sluice
worker -c 4) on a private redis-server, each scenario on a fresh worker:

* late: tenant A floods 2,000 tasks of 0.1 s; tenant B sends 50 tasks 5 s later. B's median and
  p99 wait (publish to start), with tenants on against the same calls with tenants off (every
  call the default tenant's: first in, first out).
* weights: A (weight 1) and B (weight 3) each queue 400 tasks of 0.1 s before the worker starts;
  each one's share of the slot-seconds while both have work waiting (goal: within 5 points of
  25/75), and Jain's fairness index of the shares over the weights (goal: at least 0.95).
* quota: tenant capped (quota: one slot) and the default tenant each queue 40 tasks of 0.1 s;
  the most of capped's messages ever held at once, sampled from Redis's held charges every
  5 ms (goal: 1).
* throughput: 3,000 no-op tasks end to end, half tenant a's and half b's, against all the
  default tenant's, alternated (goal: at least 0.95x).

Prints one JSON line. Usage: python bench/fairness.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SLOTS = 4


@contextmanager
def worker(env: dict[str, str], flush: bool = True) -> Iterator[None]:
    """A fresh sluice worker on the cpu class with 4 slots (on a flushed Redis, unless ``flush`` is False)."""
    from bench import fairness_app

    if flush:
        fairness_app.app.redis.flushdb()
    process = subprocess.Popen(
        [sys.executable, "-m", "sluice", "worker", "-A", "bench.fairness_app", "--queue", "cpu", "-c", str(SLOTS),
         "--without-mingle", "--without-gossip", "--loglevel", "WARNING", "-n", "fair@bench"],
        cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        fairness_app.work.delay(0).get(timeout=60)  # up and consuming
        yield
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def late(env: dict[str, str], tenants: bool) -> dict[str, float]:
    """B's waits (s) behind A's flood, with tenants on or off."""
    from bench.fairness_app import work

    with worker(env):
        work.delay_many([(0.1,)] * 2000, tenant="flood" if tenants else None, progress=False)
        time.sleep(5)
        sent = time.time()
        starts = [start for start, _ in work.delay_many([(0.1,)] * 50, tenant="late" if tenants else None,
                                                        progress=False).get(timeout=600)]
    waits = [start - sent for start in starts]
    return {"median": statistics.median(waits), "p99": percentile(waits, 0.99)}


def weights(env: dict[str, str]) -> dict[str, float]:
    """A's and B's shares of the slot-seconds while both had work waiting, and Jain's index."""
    from bench.fairness_app import app, work

    app.redis.flushdb()
    a = work.delay_many([(0.1,)] * 400, tenant="a", progress=False)
    b = work.delay_many([(0.1,)] * 400, tenant="b", progress=False)
    with worker(env, flush=False):
        runs = {"a": a.get(timeout=600), "b": b.get(timeout=600)}
    begin = min(start for done in runs.values() for start, _ in done)
    end = min(max(start for start, _ in done) for done in runs.values())  # the first to run out of waiting work
    seconds = {t: sum(max(0.0, min(e, end) - max(s, begin)) for s, e in done) for t, done in runs.items()}
    total = sum(seconds.values())
    share = {t: seconds[t] / total for t in seconds}
    x = [share["a"] / 0.25, share["b"] / 0.75]
    jain = sum(x) ** 2 / (len(x) * sum(v * v for v in x))
    return {"a": share["a"], "b": share["b"], "jain": jain}


def quota(env: dict[str, str]) -> int:
    """The most of capped's messages held at once (sampled from Redis's held charges)."""
    from bench.fairness_app import app, work
    from sluice import keys

    with worker(env):
        capped = work.delay_many([(0.1,)] * 40, tenant="capped", progress=False)
        others = work.delay_many([(0.1,)] * 40, progress=False)
        most = 0
        deadline = time.monotonic() + 300
        while not (capped.ready() and others.ready()) and time.monotonic() < deadline:
            held = Counter(r.split(b"\t")[1] for r in app.redis.hvals(keys.HELD_CHARGES))
            most = max(most, held[b"capped"])
            time.sleep(0.005)
    return most


def throughput(env: dict[str, str], tenants: bool, tasks: int = 3000) -> float:
    """Tasks/s end to end of ``tasks`` no-ops: half a's and half b's, or all the default tenant's."""
    from bench.fairness_app import work

    with worker(env):
        start = time.perf_counter()
        if tenants:
            sent = [work.delay_many([(0,)] * (tasks // 2), tenant=t, progress=False) for t in ("a", "b")]
        else:
            sent = [work.delay_many([(0,)] * tasks, progress=False)]
        for bulk in sent:
            bulk.get(timeout=600)
        return tasks / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds each way (alternated)")
    args = parser.parse_args()
    from bench import private_broker

    with private_broker() as env:
        fair, fifo = late(env, True), late(env, False)
        shares = weights(env)
        most = quota(env)
        rates: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for on in (True, False):
                rates[on].append(throughput(env, on))
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    result: dict[str, Any] = {
        "benchmark": "fairness", "slots": SLOTS,
        "late_wait_median_s": round(fair["median"], 3), "late_wait_p99_s": round(fair["p99"], 3),
        "fifo_late_wait_median_s": round(fifo["median"], 3), "fifo_late_wait_p99_s": round(fifo["p99"], 3),
        "weights_1_3_share_a": round(shares["a"], 3), "weights_1_3_share_b": round(shares["b"], 3),
        "goal_share_b": "0.70-0.80", "jain_index": round(shares["jain"], 3), "goal_jain": 0.95,
        "quota_1_slot_most_held": most, "goal_quota_most_held": 1,
        "tenants_on_tasks_per_s": round(on, 1), "tenants_off_tasks_per_s": round(off, 1),
        "throughput_on_vs_off": round(on / off, 3), "goal_throughput": 0.95,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
