"""What one task costs Redis, the figure that says how far one Redis goes: N no-op tasks end to
end (``.delay()`` then the result, bench/throughput.py's round) through sluice and through stock
Celery with its defaults, Redis's counters reset before and read after the timed part:
commands per task (by command), Redis main-thread CPU per task, and the ceiling that implies
(Redis runs commands on one thread: one CPU second / CPU per task) beside the rate measured.
The bench's own result polling (MGET) is counted apart and left out.

Prints one JSON line. Usage: python bench/redis_cost.py [--tasks 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _cpu(info: dict[str, Any]) -> float:
    return float(info["used_cpu_sys_main_thread"]) + float(info["used_cpu_user_main_thread"])


def measure(kind: str, tasks: int, env: dict[str, str]) -> dict[str, Any]:
    from bench import apps
    from bench.throughput import run_round

    client = apps.sluice_app.redis
    seen: dict[str, Any] = {}

    @contextmanager
    def window() -> Iterator[None]:
        client.config_resetstat()
        cpu = _cpu(client.info("cpu"))
        yield
        seen["cpu"] = _cpu(client.info("cpu")) - cpu
        seen["commands"] = {name.removeprefix("cmdstat_"): stats["calls"]
                            for name, stats in client.info("commandstats").items()}

    rate = run_round(kind, tasks, env, window)
    commands = seen["commands"]
    polling = commands.pop("mget", 0)
    commands.pop("info", None)
    per_task = {name: round(calls / tasks, 2) for name, calls in sorted(commands.items(), key=lambda c: -c[1])}
    cpu_us = seen["cpu"] / tasks * 1e6
    return {"tasks_per_s": round(rate, 1), "commands_per_task": round(sum(commands.values()) / tasks, 2),
            "by_command": per_task, "bench_polling_mget": polling, "redis_cpu_us_per_task": round(cpu_us, 1),
            "ceiling_tasks_per_s": round(1e6 / cpu_us)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5_000)
    args = parser.parse_args()
    from sluice.deploy.embedded import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp)) as server:
        os.environ["SLUICE_BROKER_URL"] = server.url
        env = os.environ | {"PYTHONPATH": str(ROOT)}
        figures = {kind: measure(kind, args.tasks, env) for kind in ("plain", "sluice")}
    print(json.dumps({"benchmark": "redis_cost", "tasks": args.tasks, "stock_celery": figures["plain"],
                      "sluice": figures["sluice"]}))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
