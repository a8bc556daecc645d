"""Self-sizing: each run's peak memory is observed by the watchdog; ``memory="auto"`` routes by
what was learned. Real allocations, real kills, real workers (tests/apps/learning.py: app default
1Gi fits only big (2Gi); small holds 400Mi)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice import App
from sluice.deploy.embedded import EmbeddedRedis
from sluice.deploy.metrics import TaskMetrics
from sluice.tasks.memory_profile import MemoryProfile
from tests.apps import learning
from tests.conftest import ROOT, Workers, wait_for

pytestmark = pytest.mark.integration

TASK = "tests.apps.learning."
ARGS = ("--without-mingle", "--without-gossip")
MiB = 1 << 20


def _sender(url: str) -> App:
    """A client without the tasks' code whose profile cache never serves an old read, so each
    call sees the observations of the one before (the cache's age is not what is tested)."""
    sender = App("tests.learning.sender", broker=url, classes=learning.CLASSES, default_compute=learning.DEFAULT)
    sender.memory_profiles.max_age = 0
    return sender


def _sluice(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "sluice", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=os.environ | env | {"COLUMNS": "250"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _observed(sender: App, task: str, runs: int) -> MemoryProfile:
    """The profile once it holds ``runs`` runs: the watchdog records a run on its next tick after
    the run ended, which may be just after the caller got the result."""
    return wait_for(lambda: (p := sender.memory_profile(task)).count >= runs and p, 10, f"{runs} runs of {task}")


def test_a_task_learns_its_memory_moves_to_the_small_class_and_a_kill_makes_the_next_call_bigger(
        tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis").start()
    client = server.client()
    env = {"SLUICE_BROKER_URL": server.url}
    pool = Workers(client, tmp_path)
    try:
        pool.start("tests.apps.learning", "small", "small", *ARGS, env=env)
        pool.start("tests.apps.learning", "big", "big", *ARGS, env=env)
        sender = _sender(server.url)

        # 1. Five runs at the default memory (1Gi: only big holds it), each observed.
        first = [sender.send_task(TASK + "hundred").get(timeout=60) for _ in range(5)]
        assert first == [{"queue": "big", "memory": 1 << 30}] * 5
        profile = _observed(sender, TASK + "hundred", 5)
        assert 100 * MiB < profile.p95 < 300 * MiB, profile
        # 2. Then p95 * 1.3, rounded: it fits small, and runs there at that size.
        learned = sender.send_task(TASK + "hundred").get(timeout=60)
        assert learned["queue"] == "small" and profile.p95 < learned["memory"] <= 1.5 * profile.p95, (learned, profile)

        # 3. A task learned at ~20MiB asked for 300MiB: killed at its learned size, escalated by
        # its policy, succeeds; the kill is observed, so the next call starts bigger.
        for _ in range(5):
            sender.send_task(TASK + "varies", args=(20,)).get(timeout=60)
        _observed(sender, TASK + "varies", 5)
        small = sender.send_task(TASK + "varies", args=(20,)).get(timeout=60)
        grown = sender.send_task(TASK + "varies", args=(300,))
        assert grown.get(timeout=90)["memory"] > small["memory"]
        after = wait_for(lambda: (p := sender.memory_profile(TASK + "varies")).peak >= 300 * MiB and p, 10,
                         "the successful 300MiB run to be observed")
        assert after.kills >= 1, after
        following = sender.send_task(TASK + "varies", args=(20,)).get(timeout=60)
        assert following["memory"] > small["memory"], (following, small)

        metrics = {(s.name, s.labels.get("task"), s.labels.get("quantile")): s.value
                   for m in TaskMetrics(client, sender.catalog, sender.settings).collect() for s in m.samples}
        assert metrics[("sluice_task_runs_observed_total", TASK + "hundred", None)] == 6
        assert metrics[("sluice_task_memory_kills_total", TASK + "varies", None)] >= 1

        explain = _sluice("explain", "-A", "tests.apps.learning", env=env)
        hundred = next(line for line in explain.splitlines() if f"{TASK}hundred" in line)
        assert "memory=auto" in hundred and "(6)" in hundred and "small" in hundred, explain
        varies = next(line for line in explain.splitlines() if f"{TASK}varies" in line)
        assert "under-provisioned" in varies, explain
        assert "reset the memory profile" in _sluice("profile", "reset", TASK + "hundred", env=env)
        assert sender.memory_profile(TASK + "hundred").count == 0
        again = subprocess.run([sys.executable, "-m", "sluice", "profile", "reset", TASK + "hundred"], cwd=ROOT,
                               capture_output=True, text=True, timeout=60, env=os.environ | env)
        assert again.returncode == 1 and "no memory profile" in again.stderr
    finally:
        pool.stop_all()
        server.stop()
