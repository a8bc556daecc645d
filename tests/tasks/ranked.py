"""A task file whose execute() reports which torchrun rank ran it (LOCAL_RANK, RANK)."""

import argparse
import os
import time

def _args():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=10)
    return p.parse_args()

def plan():
    for i in range(_args().n):
        yield {"id": f"t-{i}", "x": i}

def execute(item):
    time.sleep(0.02)  # long enough that every rank's workers get items
    return {"x2": item["x"] * 2, "local_rank": os.environ.get("LOCAL_RANK"), "rank": os.environ.get("RANK")}
