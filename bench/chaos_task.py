"""The batch side of bench/chaos.py, a ``sluice compute`` task file: every execute() appends
``start <id>`` and, once its body ran to the end, ``done <id>`` to a per-process file under
--marks, so the bench counts executions from outside Redis (files survive a Redis kill).

    sluice compute bench/chaos_task.py -- --n 1000 --sleep 0.02 --marks /tmp/marks
"""

import argparse
import os
import time


def mark(marks_dir: str, kind: str, task_id: str) -> None:
    """One whole line per event (O_APPEND keeps concurrent writers' lines apart)."""
    with open(os.path.join(marks_dir, f"{os.getpid()}.marks"), "a") as out:
        out.write(f"{kind} {task_id}\n")


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--sleep", type=float, default=0.02)
    parser.add_argument("--marks", required=True)
    return parser.parse_args()


def plan():
    for i in range(_args().n):
        yield {"id": f"item-{i}"}


def execute(item: dict) -> dict:
    args = _args()
    mark(args.marks, "start", item["id"])
    time.sleep(args.sleep)
    mark(args.marks, "done", item["id"])
    return {"ok": True}
