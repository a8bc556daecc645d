"""The memory watchdog against real processes that really allocate."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest
import redis

from sluice import keys
from sluice.workers.watchdog import MemoryWatchdog, Watched
from tests.conftest import wait_for

MiB = 1 << 20
HOLD = "import sys, time; b = bytearray({mib} * 1048576); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; " \
       "print('ready', flush=True); time.sleep(60)"


def _spawn(code: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    wait_for(lambda: "ready" in process.stdout.readline(), 30, "the allocating process")
    return process


@pytest.mark.parametrize("via_child", [False, True], ids=["process", "grandchild"])
def test_kills_a_tree_over_its_limit(redis_client: redis.Redis, via_child: bool) -> None:
    code = HOLD.format(mib=150)
    if via_child:  # the allocation happens in a child of the watched process: the tree counts
        code = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {code!r}], "
                "stdout=subprocess.PIPE, text=True); p.stdout.readline(); print('ready', flush=True); time.sleep(60)")
    process = _spawn(code)
    family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    assert len(family) == (2 if via_child else 1)
    watched = [Watched("t-1", "tests.hog", process.pid, 100 * MiB, "cpu")]
    dog = MemoryWatchdog(lambda: watched, redis_client, "w@test", interval=0.0)
    kills = dog.check_once()
    assert process.wait(10) == -9
    _, alive = psutil.wait_procs(family, timeout=10)
    assert alive == []
    assert [k.task_id for k in kills] == ["t-1"]
    assert kills[0].rss > 100 * MiB
    record = json.loads(redis_client.get(keys.memory_kill("t-1")))
    assert record["limit"] == 100 * MiB and "killed for memory" in record["message"]


def test_leaves_a_process_within_its_limit(redis_client: redis.Redis) -> None:
    process = _spawn(HOLD.format(mib=20))
    try:
        watched = [Watched("t-2", "tests.small", process.pid, 200 * MiB, "cpu")]
        dog = MemoryWatchdog(lambda: watched, redis_client, "w@test", interval=0.0)
        assert dog.check_once() == []
        time.sleep(0.2)
        assert process.poll() is None
        assert redis_client.get(keys.memory_kill("t-2")) is None
    finally:
        process.kill()
        process.wait(10)


def test_young_tasks_are_measured_from_their_second_tick(redis_client: redis.Redis) -> None:
    process = _spawn(HOLD.format(mib=150))
    watched = [Watched("t-3", "tests.hog", process.pid, 100 * MiB, "cpu")]
    dog = MemoryWatchdog(lambda: watched, redis_client, "w@test", interval=0.05)
    assert dog.check_once(now=100.0) == []          # first sight: not measured yet
    assert len(dog.check_once(now=100.06)) == 1     # one interval later: killed
    assert process.wait(10) == -9


def test_reports_a_busy_process_that_died_once(redis_client: redis.Redis) -> None:
    """A pool process killed by someone else is reported so the pool reaps it at once."""
    process = _spawn(HOLD.format(mib=5))
    watched = [Watched("t-4", "tests.victim", process.pid, 200 * MiB, "cpu")]
    deaths: list[int] = []
    dog = MemoryWatchdog(lambda: watched, redis_client, "w@test", interval=0.0, on_dead=lambda: deaths.append(1))
    assert dog.check_once() == [] and deaths == []
    process.kill()  # a zombie until reaped, as a pool child is until billiard joins it
    wait_for(lambda: dog.check_once() == [] and deaths, 10, "the death to be reported")
    dog.check_once()
    assert deaths == [1]
    process.wait(10)
