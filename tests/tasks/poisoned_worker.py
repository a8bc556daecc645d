"""A task file whose execute() dies (SIGKILL of its own process) on local worker w1 only: a
worker that fails every time, for the quarantine test."""

import argparse
import os
import signal
import time

from celery import current_task


def _args():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=10)
    return p.parse_args()


def plan():
    for i in range(_args().n):
        yield {"id": f"t-{i}", "x": i}


def execute(item):
    if current_task.request.hostname.startswith("w1."):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.01)
    return {"x2": item["x"] * 2}
