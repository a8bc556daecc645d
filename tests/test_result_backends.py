"""Result backends Celery users already run, with real workers on the small ladder
(tests/apps/ladder.py): results in a database through Celery's SQLAlchemy backend
(``db+sqlite://``, what django-celery-results users have) and ``rpc://`` (results as messages
back to the caller). Tasks, retries and escalation after a real memory kill work on each; the
delivery ledger, which rides in the STARTED store only where results live in the broker's Redis,
is claimed by the task itself in the broker's Redis instead."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import sluice
from sluice import keys
from sluice.deploy.embedded import EmbeddedRedis
from tests.conftest import ROOT, Workers, wait_for

pytestmark = pytest.mark.integration

APP = "tests.apps.ladder"
EXAMPLE = ROOT / "examples" / "task.py"


@pytest.fixture(scope="module", params=["db+sqlite", "rpc"])
def ladder_on(request: pytest.FixtureRequest, redis_server: EmbeddedRedis,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, Workers]]:
    """The ladder app, in this process and in one worker serving every class, with results in
    the backend named by the parameter (set by SLUICE_RESULT_BACKEND, as a user sets it)."""
    home = tmp_path_factory.mktemp(f"backend-{request.param}")
    backend = f"db+sqlite:///{home / 'results.sqlite'}" if request.param == "db+sqlite" else "rpc://"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLUICE_RESULT_BACKEND", backend)
        sys.modules.pop(APP, None)
        app = importlib.import_module(APP)
        assert app.app.conf.result_backend == backend
        pool = Workers(redis_server.client(), home)
        pool.start(APP, "small", "ladder", "--queue", "medium", "--queue", "large", "-c", "2",
                   "--without-mingle", "--without-gossip", env={"SLUICE_RESULT_BACKEND": backend})
        yield app, pool
        pool.stop_all()
        sys.modules.pop(APP, None)


def runs(app: ModuleType, task_id: str) -> list[str]:
    return [queue.decode() for queue in app.app.redis.lrange(f"test:runs:{task_id}", 0, -1)]


def test_a_memory_kill_escalates_and_the_result_comes_back_through_the_backend(
        ladder_on: tuple[ModuleType, Workers]) -> None:
    """Killed for memory at 150Mi on small, run again at 300Mi on medium: the caller gets the
    second attempt's result from the backend, and the attempt history names both sizes."""
    app, _ = ladder_on
    result = app.grows.delay(200)
    assert result.get(timeout=60) == {"queue": "medium", "worker": "ladder@test", "attempt": 2}
    history = sluice.attempts(result)
    assert [(h["attempt"], h["queue"], h["reason"], h["worker"]) for h in history] == [
        (1, "small", "memory", "ladder@test"), (2, "medium", "succeeded", "ladder@test")]
    # the compute of the size that succeeded rides in the result meta: a database keeps only
    # Celery's own columns (state, result, name, arguments, worker, queue, retries)
    backend = app.app.conf.result_backend
    assert history[1]["compute"] == (None if backend.startswith("db+") else {"cpu": "1", "memory": "300Mi"})
    assert runs(app, result.id) == ["small", "medium"]


def test_a_transient_error_is_retried_and_a_business_error_fails_once(ladder_on: tuple[ModuleType, Workers]) -> None:
    """A transient error is retried at the same size and then succeeds; a business error is
    stored as the task's failure after one run: both states reach the caller from the backend."""
    app, _ = ladder_on
    flaky = app.flaky.delay()
    assert flaky.get(timeout=60)["attempt"] == 2
    assert runs(app, flaky.id) == ["small", "small"]
    business = app.business.delay()
    with pytest.raises(ValueError, match="row 17 has no customer id"):
        business.get(timeout=60)
    assert runs(app, business.id) == ["small"]


def test_the_task_claims_its_delivery_in_the_brokers_redis(ladder_on: tuple[ModuleType, Workers]) -> None:
    """With results elsewhere the STARTED store carries no claim, so the task makes its own in
    the broker's Redis: the ledger entry is there after the run, naming the worker."""
    app, _ = ladder_on
    result = app.flaky.delay()
    result.get(timeout=60)
    claim = app.app.redis.get(keys.delivery(result.id))
    assert claim is not None and b"ladder@test" in claim


def test_a_copy_of_a_finished_task_runs_again_only_where_no_worker_can_read_its_result(
        ladder_on: tuple[ModuleType, Workers]) -> None:
    """A second message under the id of a task that succeeded: with results in a database the
    worker finds the stored success and acknowledges the copy without running the body; with
    rpc:// the success was a message to the caller, nothing a worker can read, and the copy runs
    (as on Celery) - the difference the README states."""
    app, pool = ladder_on
    first = app.long_step.delay(0.1)
    assert first.get(timeout=60)["attempt"] == 1
    app.long_step.apply_async((0.1,), task_id=first.id)
    skipped = f"task {app.long_step.name}[{first.id}] was delivered again after it finished; not running it again"
    if app.app.conf.result_backend.startswith("db+"):
        wait_for(lambda: skipped in pool.log("ladder"), 30, "the worker to take the copy and not run it")
        assert app.app.redis.get(f"test:completed:{first.id}") == b"1"
    else:
        wait_for(lambda: app.app.redis.get(f"test:completed:{first.id}") == b"2", 30, "the copy to run")
        assert skipped not in pool.log("ladder")


def test_a_batch_run_completes_with_its_chunk_states_in_the_backend(ladder_on: tuple[ModuleType, Workers],
                                                                    tmp_path: Path) -> None:
    """``sluice compute`` on its own local workers, results in the same kind of backend: the
    driver reads its chunks' states through the backend (a database query each, or the reply
    messages of rpc://) and the run ends with every item."""
    app, _ = ladder_on
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_BROKER_URL"}
    backend = app.app.conf.result_backend.replace("results.sqlite", "batch.sqlite")
    run = subprocess.run([sys.executable, "-m", "sluice", "compute", str(EXAMPLE), "-w", "2", "--results", "ndjson",
                          "--", "--n", "20"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=env | {"SLUICE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
                                    "SLUICE_RESULT_BACKEND": backend})
    assert run.returncode == 0, run.stderr
    assert sorted(json.loads(line)["id"] for line in run.stdout.splitlines()) == sorted(f"t-{i}" for i in range(20))
    assert "20 ok, 0 failed" in run.stderr
