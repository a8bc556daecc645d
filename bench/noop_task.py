"""The task file bench/compute.py runs: no-op items (per-item overhead is what is measured)."""

import argparse


def plan():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=10_000)
    for i in range(p.parse_args().n):
        yield {"id": f"i{i}"}


def execute(item):
    return {}
