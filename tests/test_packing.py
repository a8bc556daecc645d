"""A packed worker (2Gi, up to 8 tasks at once) runs as many tasks at once as fit it by their own memory,
and starts a 1.5Gi task only when 1.5Gi is free. Real worker, real Redis. What ran at once is read
from the worker's own records: its log, in the order it wrote it (each task it took, as Celery
logs "received" once admission let it in; each "succeeded"; each "no room" put-back), sized by the
compute the worker stored with each result; and from the tasks' own start and end times,
compared with each other."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from sluice import App
from sluice.deploy.embedded import EmbeddedRedis
from sluice.units import parse_memory
from tests.apps import packing
from tests.conftest import Workers

pytestmark = pytest.mark.integration

TASK = "tests.apps.packing."
SIZE = 2 << 30
#: The worker's log at DEBUG: admission's "no room ... put back" lines are debug.
WORKER = ("--without-mingle", "--without-gossip", "--loglevel", "DEBUG")
_EVENT = re.compile(r"\] (?:Task \S+\[(?P<id>[0-9a-f-]{36})\] (?P<event>received|succeeded)\b"
                    r"|no room for task (?P<no_room>\S+) )")


def _worker_events(log: str) -> list[tuple[str, str]]:
    """The worker's log as (event, task id) in the order written; a put-back is ("no room", task name)."""
    events = []
    for line in log.splitlines():
        match = _EVENT.search(line)
        if match and match["no_room"]:
            events.append(("no room", match["no_room"]))
        elif match:
            events.append((match["event"], match["id"]))
    return events


def _held(events: list[tuple[str, str]], memory: dict[str, int]) -> list[tuple[str, str, set[str]]]:
    """After each event, the tasks the worker had taken and not yet finished. A task's room is
    freed after its "succeeded" line is written, so this is never more than the worker held."""
    held: set[str] = set()
    states = []
    for event, subject in events:
        if event == "received":
            assert subject not in held, f"{subject} received twice"
            held.add(subject)
        elif event == "succeeded":
            held.discard(subject)
        states.append((event, subject, set(held)))
    return states


def _memory(results: list[Any]) -> dict[str, int]:
    """Each task's memory as the worker stored it with the result (the compute it ran at)."""
    return {r.id: parse_memory(r.backend.get_task_meta(r.id)["compute"]["memory"]) for r in results}


def _peak_concurrent(spans: list[dict[str, float]], memory: dict[str, int]) -> tuple[int, int]:
    """The most tasks, and the most memory, running at one instant by the tasks' own start and end times."""
    starts = [(s["start"], 1, memory[s["id"]]) for s in spans]
    ends = [(s["end"], -1, -memory[s["id"]]) for s in spans]
    events = sorted(starts + ends, key=lambda e: (e[0], e[1]))    # at a tie an end comes before a start
    tasks = used = most_tasks = most_memory = 0
    for _, step, size in events:
        tasks, used = tasks + step, used + size
        most_tasks, most_memory = max(most_tasks, tasks), max(most_memory, used)
    return most_tasks, most_memory


def test_a_packed_worker_fills_its_memory_never_exceeds_it_and_a_big_task_waits_for_room(tmp_path: Path) -> None:
    """6 tasks of 200Mi, one of 1.5Gi, 6 of 200Mi on a 2Gi worker: the worker holds at most 2Gi
    at any point of its own record, holds 5 or more tasks at once, put the big task back for want
    of room before it took it, took it only once no more than 512Mi was held beside it; the tasks'
    own times agree (never more than 2Gi running at once, never more than 512Mi at once beside the
    big one)."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    client = server.client()
    pool = Workers(client, tmp_path)
    try:
        pool.start("tests.apps.packing", "packed", "packed", *WORKER, env={"SLUICE_BROKER_URL": server.url})
        sender = App("tests.packing.sender", broker=server.url, classes=packing.CLASSES)
        results = [sender.send_task(TASK + "small", args=(1.5,)) for _ in range(6)]
        big = sender.send_task(TASK + "big", args=(1.0,))
        results.append(big)
        results += [sender.send_task(TASK + "small", args=(1.5,)) for _ in range(6)]
        for result in results:
            result.get(timeout=120)
        spans = [json.loads(raw) for raw in client.lrange("test:spans", 0, -1)]
        memory = _memory(results)
    finally:
        pool.stop_all()
        server.stop()
    assert sorted(s["id"] for s in spans) == sorted(r.id for r in results)      # each ran, once
    assert memory[big.id] == 1536 << 20 and {memory[r.id] for r in results if r is not big} == {200 << 20}
    states = _held(_worker_events(pool.log("packed")), memory)
    assert sorted(subject for event, subject, _ in states if event == "received") == sorted(memory)
    assert max(sum(memory[t] for t in held) for _, _, held in states) <= SIZE, "the worker held more than 2Gi"
    assert max(len(held) for _, _, held in states) >= 5                         # several 200Mi tasks at once
    taken = next(i for i, (event, subject, _) in enumerate(states) if (event, subject) == ("received", big.id))
    assert ("no room", TASK + "big") in [(event, subject) for event, subject, _ in states[:taken]], \
        "the big task was taken without ever being put back for want of room"
    assert sum(memory[t] for t in states[taken][2] - {big.id}) <= SIZE - memory[big.id]

    most_tasks, most_memory = _peak_concurrent(spans, memory)
    assert most_memory <= SIZE, f"{most_memory / 2**20:.0f}Mi ran at once on a 2Gi worker"
    assert most_tasks >= 5
    big_span = next(s for s in spans if s["id"] == big.id)
    beside = [{"id": s["id"], "start": max(s["start"], big_span["start"]), "end": min(s["end"], big_span["end"])}
              for s in spans if s is not big_span and s["start"] < big_span["end"] and s["end"] > big_span["start"]]
    # at its most, not summed over the big task's run: one small task may end and another start meanwhile
    assert _peak_concurrent(beside, memory)[1] <= SIZE - memory[big.id]
    assert any(s["end"] <= big_span["start"] for s in spans), "the big task started before any task had ended"


def test_a_packed_worker_backfills_past_a_big_task_it_has_no_room_for_but_not_forever(tmp_path: Path) -> None:
    """A 1.5Gi task queued behind 8 running 200Mi tasks (1.6Gi of the 2Gi worker, ending one at a
    time) waits, and the small tasks queued behind it are taken in the room each end leaves
    (backfill) instead of waiting too; but at most ``slots`` (8) of them pass it, so it is not
    starved: it is taken before the queue behind it has drained. Passing is read from the order
    in which the worker took the tasks (its log), not from times. Every task runs once, and memory
    held never exceeds the worker."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    client = server.client()
    pool = Workers(client, tmp_path)
    try:
        pool.start("tests.apps.packing", "packed", "packed", *WORKER, env={"SLUICE_BROKER_URL": server.url})
        sender = App("tests.packing.sender", broker=server.url, classes=packing.CLASSES)
        # staggered ends (0.4 s apart): each frees 200Mi, room for a small task but not the big one
        first = [sender.send_task(TASK + "small", args=(1.0 + 0.4 * i,)) for i in range(8)]
        big = sender.send_task(TASK + "big", args=(0.5,))
        behind = [sender.send_task(TASK + "small", args=(0.5,)) for _ in range(30)]
        for result in [*first, big, *behind]:
            result.get(timeout=120)
        spans = {s["id"]: s for s in (json.loads(raw) for raw in client.lrange("test:spans", 0, -1))}
        memory = _memory([*first, big, *behind])
    finally:
        pool.stop_all()
        server.stop()
    assert sorted(spans) == sorted(r.id for r in [*first, big, *behind])    # each ran, once
    assert _peak_concurrent(list(spans.values()), memory)[1] <= SIZE
    states = _held(_worker_events(pool.log("packed")), memory)
    assert max(sum(memory[t] for t in held) for _, _, held in states) <= SIZE, "the worker held more than 2Gi"
    taken = [subject for event, subject, _ in states if event == "received"]
    assert sorted(taken) == sorted(memory)                                   # each taken once
    passed = [r.id for r in behind if taken.index(r.id) < taken.index(big.id)]
    assert passed, "no task behind the big one was taken while it waited: no backfill"
    assert len(passed) <= packing.CLASSES[0].slots, f"{len(passed)} tasks passed the big one (bound: 8)"
    assert len(passed) < len(behind), "the big task waited for the whole queue"


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
