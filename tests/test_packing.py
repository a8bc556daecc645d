"""A packed worker (2Gi, up to 8 tasks) runs as many tasks at once as fit it by their own memory,
and starts a 1.5Gi task only when 1.5Gi is free. Real worker, real Redis; the spans are the
tasks' own start and end times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice import App
from sluice.deploy.embedded import EmbeddedRedis
from tests.apps import packing
from tests.conftest import Workers

pytestmark = pytest.mark.integration

TASK = "tests.apps.packing."
SIZE = 2 << 30


def _peak_concurrent(spans: list[dict[str, float]]) -> tuple[int, int]:
    """The most tasks, and the most memory, running at one instant."""
    events = sorted([(s["start"], 1, s["memory"]) for s in spans] + [(s["end"], -1, -s["memory"]) for s in spans],
                    key=lambda e: (e[0], e[1]))    # at a tie an end comes before a start
    tasks = memory = most_tasks = most_memory = 0
    for _, step, size in events:
        tasks, memory = tasks + step, memory + size
        most_tasks, most_memory = max(most_tasks, tasks), max(most_memory, memory)
    return most_tasks, most_memory


def test_a_packed_worker_fills_its_memory_and_never_exceeds_it(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis").start()
    client = server.client()
    pool = Workers(client, tmp_path)
    try:
        pool.start("tests.apps.packing", "packed", "packed", "--without-mingle", "--without-gossip",
                   env={"SLUICE_BROKER_URL": server.url})
        sender = App("tests.packing.sender", broker=server.url, classes=packing.CLASSES)
        results = [sender.send_task(TASK + "small", args=(1.5,)) for _ in range(6)]
        results.append(sender.send_task(TASK + "big", args=(1.0,)))
        results += [sender.send_task(TASK + "small", args=(1.5,)) for _ in range(6)]
        for result in results:
            result.get(timeout=120)
        spans = [json.loads(raw) for raw in client.lrange("test:spans", 0, -1)]
    finally:
        pool.stop_all()
        server.stop()
    assert sorted(s["id"] for s in spans) == sorted(r.id for r in results)      # each ran, once
    most_tasks, most_memory = _peak_concurrent(spans)
    assert most_memory <= SIZE, f"{most_memory / 2**20:.0f}Mi ran at once on a 2Gi worker"
    assert most_tasks >= 5                         # several 200Mi tasks at once
    big = next(s for s in spans if s["memory"] == 1536 << 20)
    beside = [s for s in spans if s is not big and s["start"] < big["end"] and s["end"] > big["start"]]
    assert sum(s["memory"] for s in beside) <= SIZE - big["memory"]
    assert any(s["start"] < big["start"] for s in spans if s is not big)     # it waited for room


def test_a_packed_worker_backfills_past_a_big_task_it_has_no_room_for_but_not_forever(tmp_path: Path) -> None:
    """A 1.5Gi task queued behind 8 running 200Mi tasks (1.6Gi of the 2Gi worker, ending one at a
    time) waits, and the small tasks queued behind it start in the room each end leaves (backfill)
    instead of waiting too; but
    at most ``slots`` (8) of them pass it, so it is not starved: it starts before the queue behind
    it has drained. Every task runs once, and memory in use never exceeds the worker."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    client = server.client()
    pool = Workers(client, tmp_path)
    try:
        pool.start("tests.apps.packing", "packed", "packed", "--without-mingle", "--without-gossip",
                   env={"SLUICE_BROKER_URL": server.url})
        sender = App("tests.packing.sender", broker=server.url, classes=packing.CLASSES)
        # staggered ends (0.4 s apart): each frees 200Mi, room for a small task but not the big one
        first = [sender.send_task(TASK + "small", args=(1.0 + 0.4 * i,)) for i in range(8)]
        big = sender.send_task(TASK + "big", args=(0.5,))
        behind = [sender.send_task(TASK + "small", args=(0.5,)) for _ in range(30)]
        for result in [*first, big, *behind]:
            result.get(timeout=120)
        spans = {s["id"]: s for s in (json.loads(raw) for raw in client.lrange("test:spans", 0, -1))}
    finally:
        pool.stop_all()
        server.stop()
    assert sorted(spans) == sorted(r.id for r in [*first, big, *behind])    # each ran, once
    assert _peak_concurrent(list(spans.values()))[1] <= SIZE
    started = spans[big.id]["start"]
    # a task admitted just after the big one may enter its body a few ms before it (another pool
    # process): only tasks that started clearly before it passed it
    passed = [r.id for r in behind if spans[r.id]["start"] < started - 0.05]
    assert passed, "no task behind the big one started while it waited: no backfill"
    assert len(passed) <= packing.CLASSES[0].slots, f"{len(passed)} tasks passed the big one (bound: 8)"
    assert any(spans[r.id]["start"] > started for r in behind), "the big task waited for the whole queue"


def test_the_demand_of_a_packed_queue_sums_its_messages_compute(tmp_path: Path) -> None:
    """What the autoscaler scales a packed class by: each waiting message's effective compute,
    from the task's code or its sluice_compute header."""
    from sluice.queues.status import demand

    with EmbeddedRedis(tmp_path / "redis") as server:
        sender = App("tests.packing.sender", broker=server.url, classes=packing.CLASSES)
        for _ in range(3):
            sender.send_task(TASK + "small", args=(0,))
        sender.send_task(TASK + "big", args=(0,))
        sender.send_task(TASK + "small", args=(0,), headers={"sluice_compute": {"cpu": "2", "memory": "1Gi"}})
        assert demand(packing.app, server.client(), "packed") == (6000, 3 * (200 << 20) + (1536 << 20) + (1 << 30))
