"""Rate limits across the cluster, measured with real workers (two workers of 2 processes each,
on one class) on a private redis-server:

* rate: 500 calls of a rate_limit="50/s" task; the rate achieved over the run against the limit
  (goal 0.95-1.00x, never over) and the most starts in any one-second window (the bodies'
  start times; goal at most 50). Beside it, stock Celery with the same rate_limit on the same
  two workers (each worker keeps the rate for itself).
* cost: Redis commands per task for those 500 limited calls against 500 unlimited ones through
  the same workers (fetch scripts, bell waits, and every command, those inside scripts included).
* throughput: 3,000 unlimited no-ops end to end while 40 rate-limited calls wait in the same
  queue, against the 3,000 alone, alternated (goal at least 0.95x); and once with 400 limited
  calls waiting (they are parked out of the fetch's way; a fetch reads at most 64 past).

Stock Celery's run takes minutes: after a first burst its workers start about two rate-limited
tasks a second (they hold them in memory against their prefetch).

Prints one JSON line. Usage: python bench/limits.py [--rounds 2]
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CALLS = 500


@contextmanager
def workers(env: dict[str, str], plain: bool = False) -> Iterator[None]:
    """Two workers of 2 processes on the cpu class (stock Celery's on its default queue), on a flushed Redis."""
    from bench import limits_app

    limits_app.app.redis.flushdb()
    if plain:
        cmd = [sys.executable, "-m", "celery", "-A", "bench.limits_app:plain_app", "worker", "-Q", "celery"]
    else:
        cmd = [sys.executable, "-m", "sluice", "worker", "-A", "bench.limits_app", "--queue", "cpu"]
    processes = [
        subprocess.Popen([*cmd, "-c", "2", "--without-mingle", "--without-gossip", "--loglevel", "WARNING",
                          "-n", f"w{i}@bench"], cwd=ROOT, env=env, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(2)]
    try:
        task = limits_app.plain_metered if plain else limits_app.free
        task.delay().get(timeout=60)  # up and consuming
        time.sleep(1.5)  # both workers
        yield
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


def most_in_a_second(starts: Sequence[float]) -> int:
    """The most of ``starts`` (sorted) in any half-open one-second window [t, t + 1), one
    opening at each start."""
    most, first = 0, 0
    for last, at in enumerate(starts):
        while at - starts[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


def rate_run(env: dict[str, str], plain: bool) -> dict[str, Any]:
    """The rate achieved by CALLS limited calls, and Redis's commands per call (sluice only)."""
    from bench import limits_app

    client = limits_app.app.redis
    task = limits_app.plain_metered if plain else limits_app.metered
    with workers(env, plain):
        client.config_resetstat()
        starts = sorted(r.get(timeout=600) for r in [task.delay() for _ in range(CALLS)])
        commands = _commands(client)
    achieved = (len(starts) - 1) / (starts[-1] - starts[0])
    return {"achieved_per_s": achieved, "most_in_a_second": most_in_a_second(starts), "commands": commands}


def _commands(client: Any) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): s["calls"] for name, s in stats.items() if name != "cmdstat_info"}


def free_cost(env: dict[str, str]) -> dict[str, int]:
    """Redis's commands for CALLS unlimited calls through the same workers."""
    from bench import limits_app

    client = limits_app.app.redis
    with workers(env):
        client.config_resetstat()
        for r in [limits_app.free.delay() for _ in range(CALLS)]:
            r.get(timeout=600)
        return _commands(client)


def throughput(env: dict[str, str], waiting: int, tasks: int = 3000) -> float:
    """Unlimited tasks/s end to end with ``waiting`` rate-limited calls queued ahead of them."""
    from bench import limits_app

    with workers(env):
        limited = [limits_app.metered.delay() for _ in range(waiting)]
        start = time.perf_counter()
        limits_app.free.delay_many([()] * tasks, progress=False).get(timeout=600)
        rate = tasks / (time.perf_counter() - start)
        for r in limited:
            r.forget()
    return rate


def per_call(commands: dict[str, int], names: tuple[str, ...] | None = None) -> float:
    return round(sum(n for name, n in commands.items() if names is None or name in names) / CALLS, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds each way (alternated)")
    args = parser.parse_args()
    from bench import private_broker

    with private_broker() as env:
        from bench import limits_app  # its apps read the broker's URL

        sluice_rate = rate_run(env, plain=False)
        plain_rate = rate_run(env, plain=True)
        free = free_cost(env)
        rates: dict[int, list[float]] = {0: [], 40: [], 400: []}
        for _ in range(args.rounds):
            for waiting in (40, 0):
                rates[waiting].append(throughput(env, waiting))
        rates[400].append(throughput(env, 400))
    limit = limits_app.RATE
    limited = sluice_rate["commands"]
    median = {k: statistics.median(v) for k, v in rates.items()}
    result: dict[str, Any] = {
        "benchmark": "limits", "workers": "2 x 2 processes", "rate_limit_per_s": limit, "calls": CALLS,
        "achieved_vs_limit": round(sluice_rate["achieved_per_s"] / limit, 3), "goal_achieved": "0.95-1.00",
        "most_in_a_second": sluice_rate["most_in_a_second"], "goal_most_in_a_second": limit,
        "celery_achieved_vs_limit": round(plain_rate["achieved_per_s"] / limit, 3),
        "celery_most_in_a_second": plain_rate["most_in_a_second"],
        "limited_fetches_per_call": per_call(limited, ("evalsha",)),
        "unlimited_fetches_per_call": per_call(free, ("evalsha",)),
        "limited_bell_waits_per_call": per_call(limited, ("brpop",)),
        "unlimited_bell_waits_per_call": per_call(free, ("brpop",)),
        "limited_commands_per_call": per_call(limited), "unlimited_commands_per_call": per_call(free),
        "unlimited_tasks_per_s_limits_off": round(median[0], 1),
        "unlimited_tasks_per_s_40_limited_waiting": round(median[40], 1),
        "throughput_on_vs_off": round(median[40] / median[0], 3), "goal_throughput": 0.95,
        "unlimited_tasks_per_s_400_limited_waiting": round(median[400], 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
