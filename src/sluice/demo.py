"""The demo app: one cpu task, one highmem task and one gpu task (``sluice demo`` runs it).

Each task reports the queue it was delivered on and the worker that ran it, so the routing
is visible: a task's declared compute picks its resource class.
"""

from __future__ import annotations

from typing import Any

from sluice import App, Compute

app = App("sluice.demo")


def _where(task: Any) -> dict[str, str]:
    return {"queue": task.request.delivery_info.get("routing_key", "?"), "worker": task.request.hostname}


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


def main() -> None:
    """``python -m sluice.demo``: submit the three tasks to the configured broker, print where they ran."""
    for task, args in SUBMISSIONS:
        out = task.delay(*args).get(timeout=300)
        print(f"{task.name}: {out['value']} (queue {out['queue']}, worker {out['worker']})")


if __name__ == "__main__":
    main()
