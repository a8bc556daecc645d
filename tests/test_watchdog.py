"""The memory watchdog against real processes that really allocate."""

from __future__ import annotations

import json
import os
import selectors
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
       "print('ready', flush=True); [print(line, end='', flush=True) for line in sys.stdin]"


def _read_until(process: subprocess.Popen[bytes], token: bytes, timeout: float) -> None:
    """Read the process's output until ``token`` appears; fail after ``timeout`` seconds, or at once
    if its output ends (it exited) first. Never blocks past the deadline."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    seen = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while token not in seen:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                pytest.fail(f"timed out after {timeout}s waiting for {token!r} from pid {process.pid} (read {seen!r})")
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                pytest.fail(f"pid {process.pid} ended its output (exit {process.poll()}) before {token!r}: {seen!r}")
            seen += chunk


def _spawn(code: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        _read_until(process, b"ready", 30)
    except BaseException:
        process.kill()
        process.wait(10)
        raise
    return process


def _answers(process: subprocess.Popen[bytes]) -> bool:
    """The process echoes a line sent to it now: it was running after everything before this call
    (a SIGKILL sent earlier leaves it no instant to run in)."""
    assert process.stdin is not None
    process.stdin.write(b"ping\n")
    process.stdin.flush()
    _read_until(process, b"ping", 30)
    return True


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
        assert _answers(process)                    # not killed: it still runs after the check
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
