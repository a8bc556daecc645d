"""Revokes that outlive offline workers, with a real redis-server and real workers: a task
revoked while no worker was up is never started by the worker that comes up later (it ends
REVOKED, visibly); ``sluice revoke`` records and broadcasts; ``terminate=True`` stops a running
task, which ends REVOKED and is not retried; and the record itself (kept as long as results,
then forgotten)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from types import ModuleType

import pytest
import redis

from sluice import keys
from sluice.deploy.embedded import EmbeddedRedis
from sluice.queues import revokes
from tests.conftest import ROOT, Workers, wait_for

WORKER = ("-c", "2", "--without-mingle", "--without-gossip")


@pytest.fixture
def tenants(redis_server: EmbeddedRedis) -> ModuleType:
    return importlib.import_module("tests.apps.tenants")


def test_a_revoke_is_kept_as_long_as_results_and_then_forgotten(redis_client: redis.Redis) -> None:
    assert revokes.record(redis_client, ["a", "b"], keep=60) == 2
    assert revokes.revoked(redis_client, ["a", "b", "c"]) == [True, True, False]
    revokes.record(redis_client, ["old"], keep=-1)            # its keeping already past
    assert revokes.revoked(redis_client, ["old"]) == [False]
    revokes.record(redis_client, [], keep=60)                 # a record also forgets the expired
    assert redis_client.zscore(keys.REVOKED, "old") is None


def test_a_task_revoked_while_its_only_worker_is_stopped_never_runs_after_it_starts_again(
        tenants: ModuleType, workers: Workers, redis_client: redis.Redis) -> None:
    """Celery's revoke lives in live workers' memory: a worker that was down when it was sent
    runs the task. Here the worker, stopped, then started again, ends the task REVOKED without
    running it, and runs the next one."""
    workers.start("tests.apps.tenants", "cpu", "only", *WORKER)
    assert tenants.nap.delay("before", 0).get(timeout=60) == "before"
    workers.stop_all()
    doomed = tenants.nap.delay("doomed", 0)
    doomed.revoke()                                           # no worker is up to hear the broadcast
    after = tenants.nap.delay("after", 0)
    workers.start("tests.apps.tenants", "cpu", "only", *WORKER)
    assert after.get(timeout=60) == "after"
    wait_for(lambda: doomed.state == "REVOKED", 30, "the revoked task to end REVOKED")
    assert b"doomed" not in redis_client.lrange(tenants.STARTS, 0, -1)


def test_sluice_revoke_records_the_ids_and_a_later_worker_honours_them(
        tenants: ModuleType, workers: Workers, redis_client: redis.Redis) -> None:
    calls = [tenants.nap.delay("by-cli", 0) for _ in range(2)]
    done = subprocess.run([sys.executable, "-m", "sluice", "revoke", "-A", "tests.apps.tenants",
                           *(call.id for call in calls)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "revoked 2 task(s)" in done.stdout
    assert revokes.revoked(redis_client, [call.id for call in calls]) == [True, True]
    workers.start("tests.apps.tenants", "cpu", "cli", *WORKER)
    for call in calls:
        wait_for(lambda call=call: call.state == "REVOKED", 30, f"{call.id} to end REVOKED")
    assert b"by-cli" not in redis_client.lrange(tenants.STARTS, 0, -1)


def test_revoke_with_terminate_stops_a_running_task_which_ends_revoked_and_is_not_retried(
        workers: Workers, redis_server: EmbeddedRedis, redis_client: redis.Redis) -> None:
    """A 30 s step with a retry policy, running: revoked with terminate, its pool process is
    killed at once, it ends REVOKED, and no second attempt is published."""
    ladder = importlib.import_module("tests.apps.ladder")
    workers.start("tests.apps.ladder", "small", "terminating", *WORKER)
    step = ladder.long_step.delay(30.0)
    wait_for(lambda: redis_client.keys(f"test:running:{step.id}:*"), 30, "the step to run")
    step.revoke(terminate=True)
    wait_for(lambda: step.state == "REVOKED", 3, "the step to end REVOKED")   # within a second, on a quiet box
    time.sleep(1.5)                                           # a retry would have been published by now
    assert redis_client.llen(f"test:runs:{step.id}") == 1 and step.state == "REVOKED"
