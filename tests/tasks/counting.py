"""A task file for the batch tests: every execute() leaves a mark the test can count.

--marks DIR       append "<id>\\n" to DIR/<pid>.marks on every execution (O_APPEND: lines stay whole)
--done DIR        append "<id> <time.time()>\\n" to DIR/<pid>.done when an execution's body ends
--sleep S         each execute() sleeps S seconds
--fail-every K    ids whose number is a multiple of K raise ValueError (a business failure)
--dup-every K     plan() yields every K-th item twice
--exit-on I       item I calls sys.exit(3) (a BaseException, not an Exception)
--nan-on I        item I returns a NaN deep in its result
--gate PATH --gate-from I   items numbered I or more wait until PATH exists (so a test can act
                  while the run surely has work left, however fast the machine)
"""

import argparse
import os
import sys
import time


def _args():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--marks", default=None)
    p.add_argument("--done", default=None)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--dup-every", type=int, default=0)
    p.add_argument("--exit-on", type=int, default=None)
    p.add_argument("--nan-on", type=int, default=None)
    p.add_argument("--gate", default=None)
    p.add_argument("--gate-from", type=int, default=0)
    return p.parse_args()


def plan():
    args = _args()
    for i in range(args.n):
        yield {"id": f"item-{i}", "i": i}
        if args.dup_every and i % args.dup_every == 0:
            yield {"id": f"item-{i}", "i": i}
    yield {"i": -1}                      # no id: sluice gives it a UUID


def execute(item):
    args = _args()
    if args.marks:
        with open(os.path.join(args.marks, f"{os.getpid()}.marks"), "a") as out:
            out.write(f"{item['id']}\n")
    while args.gate and item["i"] >= args.gate_from and not os.path.exists(args.gate):
        time.sleep(0.01)
    if args.sleep:
        time.sleep(args.sleep)
    if args.fail_every and item["i"] > 0 and item["i"] % args.fail_every == 0:
        raise ValueError(f"item {item['i']} is not welcome")
    if item["i"] == args.exit_on:
        sys.exit(3)
    if item["i"] == args.nan_on:
        return {"stats": {"loss": [1.0, float("nan")]}}
    if args.done:
        with open(os.path.join(args.done, f"{os.getpid()}.done"), "a") as out:
            out.write(f"{item['id']} {time.time()}\n")
    return {"square": item["i"] ** 2}


if __name__ == "__main__":
    for it in plan():
        print(execute(it))
