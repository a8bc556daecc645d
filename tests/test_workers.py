"""Real workers (sluice worker and plain celery worker) on a real redis-server."""

from __future__ import annotations

import json
import subprocess
import sys
from types import ModuleType

import pytest
import redis

from sluice import keys
from sluice.errors import MemoryKilled
from tests.conftest import ROOT, Workers

pytestmark = pytest.mark.integration
FAST = ("--without-mingle", "--without-gossip")


def test_tasks_run_on_the_class_their_compute_routes_to(basic_app: ModuleType, workers: Workers) -> None:
    workers.start("tests.apps.basic", "cpu", "cpu1", *FAST)
    workers.start("tests.apps.basic", "highmem", "highmem1", *FAST)
    small = [basic_app.default_task.delay() for _ in range(3)]
    big = [basic_app.big_task.delay() for _ in range(3)]
    assert {r.get(timeout=30)["worker"] for r in small} == {"cpu1@test"}
    assert {r.get(timeout=30)["worker"] for r in big} == {"highmem1@test"}
    assert {r.get(timeout=30)["queue"] for r in big} == {"highmem"}
    # concurrency = the class's slots (cpu: 4, highmem: 1)
    assert workers.heartbeat("cpu1")["slots"] == 4
    assert workers.heartbeat("highmem1")["slots"] == 1


def test_watchdog_kills_the_hog_and_its_neighbour_runs_on(basic_app: ModuleType, workers: Workers,
                                                          redis_client: redis.Redis) -> None:
    workers.start("tests.apps.basic", "cpu", "cpu1", "-c", "2", *FAST)
    neighbour = basic_app.sleeper.delay(3)
    within = basic_app.hog.delay(30, hold=0.5)
    assert within.get(timeout=30)["held"] == 30 << 20
    hog = basic_app.hog.delay(400)
    with pytest.raises(MemoryKilled) as err:
        hog.get(timeout=30)
    message = str(err.value)
    assert "killed for memory" in message and "on class cpu" in message and "200Mi" in message
    assert hog.state == "FAILURE"
    record = json.loads(redis_client.get(keys.memory_kill(hog.id)))
    assert record["limit"] == 200 << 20 and record["rss"] > record["limit"] and record["resource_class"] == "cpu"
    assert neighbour.get(timeout=30)["worker"] == "cpu1@test"
    assert redis_client.get(keys.memory_kill(neighbour.id)) is None


def test_plain_celery_worker_behaves_the_same(basic_app: ModuleType, workers: Workers) -> None:
    workers.start("tests.apps.basic", "cpu", "plain1", *FAST, plain_celery=True)
    assert workers.heartbeat("plain1")["slots"] == 4
    hog = basic_app.hog.delay(400)
    with pytest.raises(MemoryKilled, match="on class cpu"):
        hog.get(timeout=30)
    assert basic_app.default_task.delay().get(timeout=30)["worker"] == "plain1@test"


def test_explicit_concurrency_overrides_slots(basic_app: ModuleType, workers: Workers) -> None:
    workers.start("tests.apps.basic", "cpu", "cpu2", "-c", "1", *FAST)
    assert workers.heartbeat("cpu2")["slots"] == 1


def test_gpu_class_refused_without_a_gpu(redis_client: redis.Redis, workers: Workers) -> None:
    env = {"SLUICE_GPU_COUNT": "0", "PYTHONPATH": str(ROOT)}
    cli = subprocess.run([sys.executable, "-m", "sluice", "worker", "-A", "tests.apps.basic", "--queue", "gpu"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT, env={**__import__("os").environ, **env})
    assert cli.returncode != 0
    assert "needs a GPU" in cli.stderr and "--allow-no-gpu" in cli.stderr
    plain = workers.start("tests.apps.basic", "gpu", "gpu0", *FAST, plain_celery=True, env=env, wait=False)
    assert plain.wait(60) != 0
    assert "GpuUnavailable" in workers.log("gpu0") and "--allow-no-gpu" in workers.log("gpu0")
    workers.start("tests.apps.basic", "gpu", "gpu1", "--allow-no-gpu", *FAST, env=env)
    workers.start("tests.apps.basic", "gpu", "gpu2", *FAST, plain_celery=True, env={"SLUICE_GPU_COUNT": "1"})
    assert workers.heartbeat("gpu2")["classes"] == ["gpu"]


def test_the_ledger_claim_is_made_with_the_started_state_or_on_its_own_without_one(
        basic_app: ModuleType, workers: Workers, redis_client: redis.Redis) -> None:
    """A task's ledger claim rides in its STARTED store; a task that stores no STARTED state
    (``track_started=False``) claims on its own: both runs leave this worker's claim."""
    workers.start("tests.apps.basic", "cpu", "cpu1", *FAST)
    tracked, untracked = basic_app.double.delay(1), basic_app.untracked.delay(2)
    assert (tracked.get(timeout=30), untracked.get(timeout=30)) == (2, 2)
    for result in (tracked, untracked):
        claim = json.loads(redis_client.get(keys.delivery(result.id)))
        assert (claim["worker"], claim["attempt"]) == ("cpu1@test", 1)


def test_a_task_declared_result_args_false_stores_its_state_without_its_arguments(
        basic_app: ModuleType, workers: Workers, redis_client: redis.Redis) -> None:
    """result_extended is on (Flower, sluice.attempts() read it), so Celery stores a task's
    arguments with its result; ``result_args=False`` leaves them out (a batch chunk's thousand
    items are not stored again), and keeps the rest of the extended meta."""
    workers.start("tests.apps.basic", "cpu", "cpu1", *FAST)
    bulky, plain = basic_app.bulky.delay(list(range(1000))), basic_app.double.delay(21)
    assert (bulky.get(timeout=30), plain.get(timeout=30)) == (1000, 42)
    stored = {r: json.loads(redis_client.get(basic_app.app.backend.get_key_for_task(r.id))) for r in (bulky, plain)}
    assert "args" not in stored[bulky] and "kwargs" not in stored[bulky]
    assert stored[bulky]["name"] == "tests.apps.basic.bulky" and stored[bulky]["compute"]
    assert stored[plain]["args"] == [21]
