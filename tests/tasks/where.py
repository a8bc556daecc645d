"""A task file whose execute() reports where it ran (torchrun's LOCAL_RANK and RANK), and with
--die-on PREFIX dies (SIGKILL of its own process) on every local worker whose name starts with
PREFIX: a worker that fails every time, for the quarantine test."""

import argparse
import os
import signal
import time

from celery import current_task


def _args():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--die-on", default=None, help="worker name prefix whose items die")
    return p.parse_args()


def plan():
    for i in range(_args().n):
        yield {"id": f"t-{i}", "x": i}


def execute(item):
    die_on = _args().die_on
    if die_on and current_task.request.hostname.startswith(die_on):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.02)  # long enough that every worker (every rank's) gets items
    return {"x2": item["x"] * 2, "local_rank": os.environ.get("LOCAL_RANK"), "rank": os.environ.get("RANK")}
