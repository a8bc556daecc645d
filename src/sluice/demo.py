"""The demo app: one cpu task, one highmem task and one gpu task (``sluice demo`` runs it).

Each task reports the queue it was delivered on and the worker that ran it, so the routing
is visible: a task's declared compute picks its resource class.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from sluice import App, Compute
from sluice.queues.status import class_status

app = App("sluice.demo")


def _where(task: Any) -> dict[str, str]:
    return {"queue": task.request.delivery_info.get("routing_key", "?"), "worker": task.app.node_name(task.request)}


@app.task(bind=True, compute=Compute(cpu="500m", memory="256Mi"))
def word_count(self: Any, text: str) -> dict[str, Any]:
    """Small: fits the cpu class."""
    return {"value": len(text.split()), **_where(self)}


@app.task(bind=True, compute=Compute(memory="8Gi"))
def join_tables(self: Any, rows: int) -> dict[str, Any]:
    """Declares 8Gi: more than a cpu slot (2Gi), so it goes to highmem (cpu stays the default 1)."""
    return {"value": sum(range(rows)), **_where(self)}


@app.task(bind=True, compute=Compute(gpu=1, memory="16Gi"))
def train(self: Any, epochs: int) -> dict[str, Any]:
    """Asks for a GPU: only a gpu class can hold it."""
    return {"value": f"trained {epochs} epochs", **_where(self)}


SUBMISSIONS = ((word_count, ("the quick brown fox jumps",)), (join_tables, (1_000_000,)), (train, (3,)))


def serving_classes(wait: float) -> set[str]:
    """The classes some worker serves, once each class has one or ``wait`` seconds passed."""
    deadline = time.monotonic() + wait
    while True:
        served = {row.resource_class.name for row in class_status(app.redis, app.catalog) if row.workers}
        if served >= set(app.catalog.names) or time.monotonic() >= deadline:
            return served
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> None:
    """``python -m sluice.demo``: submit the three tasks to the configured broker and print where
    they ran; a task whose class no worker serves (docker compose without ``--profile gpu``) is
    skipped with a line saying so, not waited on."""
    parser = argparse.ArgumentParser(prog="python -m sluice.demo", description=main.__doc__)
    parser.add_argument(
        "--wait-for-workers",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for a worker of every class before skipping the classes without one",
    )
    args = parser.parse_args(argv)
    served = serving_classes(args.wait_for_workers)
    for task, task_args in SUBMISSIONS:
        where = app.catalog.route(task.effective_compute, task.name)
        if where.name not in served:
            hint = " (docker compose starts gpu workers with --profile gpu)" if where.is_gpu else ""
            print(f"{task.name}: skipped: no worker serves the {where.name} class{hint}")
            continue
        out = task.delay(*task_args).get(timeout=300)
        print(f"{task.name}: {out['value']} (queue {out['queue']}, worker {out['worker']})")


if __name__ == "__main__":
    main()
