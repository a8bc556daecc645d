"""A task file whose execute() reports where it ran (torchrun's LOCAL_RANK and RANK), and with
--die-on PREFIX dies (SIGKILL of its own process) on every local worker whose name starts with
PREFIX: a worker that fails every time, for the quarantine test. With --done DIR each completed
execute() appends its id to DIR/<pid>.done, where the test counts them."""

import argparse
import os
import signal
import time

from celery import current_task


def _args():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--die-on", default=None, help="worker name prefix whose items die")
    p.add_argument("--done", default=None, help="directory where each completed execution is noted")
    return p.parse_args()


def plan():
    for i in range(_args().n):
        yield {"id": f"t-{i}", "x": i}


def execute(item):
    args = _args()
    if args.die_on and current_task.request.hostname.startswith(args.die_on):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.02)  # long enough that every worker (every rank's) gets items
    if args.done:
        with open(os.path.join(args.done, f"{os.getpid()}.done"), "a") as out:
            out.write(f"{item['id']}\n")
    return {"x2": item["x"] * 2, "local_rank": os.environ.get("LOCAL_RANK"), "rank": os.environ.get("RANK")}
