"""Retry escalation with real workers and real allocations, on a small ladder
(small 150Mi, medium 300Mi, large 600Mi; see tests/apps/ladder.py)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from types import ModuleType

import pytest
import redis

import sluice
from sluice import keys
from sluice.deploy.embedded import EmbeddedRedis
from sluice.errors import MemoryExhausted, RetriesExhausted
from sluice.queues.broker.layout import RedisLayout
from tests.conftest import Workers, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ladder(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, Workers]]:
    """One worker serving the whole ladder (the watchdog limits by the class each message came from)."""
    import importlib

    pool = Workers(redis_server.client(), tmp_path_factory.mktemp("ladder"))
    pool.start("tests.apps.ladder", "small", "ladder", "--queue", "medium", "--queue", "large", "-c", "2",
               "--without-mingle", "--without-gossip")
    yield importlib.import_module("tests.apps.ladder"), pool
    pool.stop_all()


def runs(client: redis.Redis, task_id: str) -> list[str]:
    return [q.decode() for q in client.lrange(f"test:runs:{task_id}", 0, -1)]


def test_killed_at_150Mi_escalates_to_300Mi_on_the_next_class(ladder: tuple[ModuleType, Workers],
                                                              redis_server: EmbeddedRedis) -> None:
    app, pool = ladder
    result = app.grows.delay(200)
    value = result.get(timeout=60)
    assert value == {"queue": "medium", "worker": "ladder@test", "attempt": 2}
    history = sluice.attempts(result)
    assert [(h["attempt"], h["queue"], h["reason"]) for h in history] == [(1, "small", "memory"),
                                                                           (2, "medium", "succeeded")]
    assert history[0]["compute"] == {"cpu": "1", "memory": "150Mi"}
    assert history[1]["compute"] == {"cpu": "1", "memory": "300Mi"}   # the size that succeeded
    assert runs(redis_server.client(), result.id) == ["small", "medium"]
    assert (f"grows[{result.id}] killed for memory at 150Mi on small; retrying at 300Mi on medium (attempt 2 of 4)"
            in pool.log("ladder"))


def test_always_too_big_ends_memory_exhausted_after_exactly_the_ladder(ladder: tuple[ModuleType, Workers],
                                                                        redis_server: EmbeddedRedis) -> None:
    app, _ = ladder
    result = app.always_too_big.delay()
    with pytest.raises(MemoryExhausted) as err:
        result.get(timeout=90)
    assert str(err.value) == ("tests.apps.ladder.always_too_big failed after 3 attempt(s): killed for memory at "
                              "150Mi on small, killed for memory at 300Mi on medium, killed for memory at 600Mi on large")
    assert [h["compute"]["memory"] for h in err.value.history] == ["150Mi", "300Mi", "600Mi"]
    assert runs(redis_server.client(), result.id) == ["small", "medium", "large"]


def test_business_exception_is_not_retried(ladder: tuple[ModuleType, Workers], redis_server: EmbeddedRedis) -> None:
    app, _ = ladder
    result = app.business.delay()
    with pytest.raises(ValueError, match="row 17"):
        result.get(timeout=30)
    assert runs(redis_server.client(), result.id) == ["small"]


def test_transient_is_retried_at_the_same_size(ladder: tuple[ModuleType, Workers]) -> None:
    app, _ = ladder
    result = app.flaky.delay()
    assert result.get(timeout=30) == {"queue": "small", "worker": "ladder@test", "attempt": 2}
    first = sluice.attempts(result)[0]
    assert (first["reason"], first["compute"]["memory"], first["detail"]) == (
        "transient", "150Mi", "Transient: the warehouse was busy")


def test_poison_exit_fails_after_the_policy_with_no_hot_loop(ladder: tuple[ModuleType, Workers],
                                                             redis_server: EmbeddedRedis) -> None:
    app, _ = ladder
    result = app.poison_exit.delay()
    with pytest.raises(RetriesExhausted, match="failed after 3 attempt"):
        result.get(timeout=60)
    assert len(runs(redis_server.client(), result.id)) == 3
    assert [h["reason"] for h in sluice.attempts(result)] == ["lost"] * 3


def test_poison_sigkill_is_a_memory_kill_and_escalates(ladder: tuple[ModuleType, Workers],
                                                       redis_server: EmbeddedRedis) -> None:
    app, _ = ladder
    result = app.poison_kill.delay()
    with pytest.raises(MemoryExhausted):
        result.get(timeout=60)
    assert runs(redis_server.client(), result.id) == ["small", "medium", "large"]
    assert {h["detail"] for h in sluice.attempts(result)} == {"killed by SIGKILL (likely the kernel's OOM killer)"}


def test_without_a_policy_a_memory_kill_fails_once(ladder: tuple[ModuleType, Workers],
                                                   redis_server: EmbeddedRedis) -> None:
    app, _ = ladder
    result = app.no_policy_hog.delay()
    with pytest.raises(sluice.MemoryKilled, match="on class small"):
        result.get(timeout=30)
    assert runs(redis_server.client(), result.id) == ["small"]


def test_eager_mode_warns_once_and_runs(ladder: tuple[ModuleType, Workers], caplog: pytest.LogCaptureFixture) -> None:
    app, _ = ladder
    with caplog.at_level(logging.WARNING, logger="sluice.task"):
        first = app.flaky.apply()
        app.flaky.apply()
    assert first.state == "FAILURE"  # no envelope in-process: the Transient is not retried
    warnings = [r.message for r in caplog.records if "runs in-process" in r.message]
    assert len(warnings) == 1 and "memory=150Mi" in warnings[0]


def test_a_copy_of_a_finished_task_is_not_run_again(ladder: tuple[ModuleType, Workers],
                                                    redis_server: EmbeddedRedis) -> None:
    """A second message under the id of a task that already succeeded (a redelivery, or a
    producer publishing twice) is acknowledged without running the body: the stored result
    stands, the body ran once."""
    app, pool = ladder
    client = redis_server.client()
    first = app.long_step.delay(0.1)
    assert first.get(timeout=60)["attempt"] == 1
    again = app.long_step.apply_async((0.1,), task_id=first.id)
    queue = app.app.route(app.long_step.name).name
    skipped = f"task {app.long_step.name}[{first.id}] was delivered again after it finished; not running it again"
    wait_for(lambda: skipped in pool.log("ladder"), 30, "the worker to take the copy and decide not to run it")
    wait_for(lambda: not client.llen(queue) and all(h.task_id != first.id for h in RedisLayout().held(client)), 30,
             "the copy to be acked")   # only this task: the module's database is not flushed per test
    assert client.get(f"test:completed:{first.id}") == b"1"       # the body ran once
    assert again.get(timeout=10)["attempt"] == 1                   # the first attempt's result stands


def test_a_failing_retry_decision_fails_the_task_visibly_and_acknowledges_it(ladder: tuple[ModuleType, Workers],
                                                                            redis_server: EmbeddedRedis) -> None:
    """sluice's own hook raising in the worker (here the attempt-history key holds a string, so
    recording the lost attempt fails with WRONGTYPE) fails the task with WorkerLost naming the
    cause and acknowledges its message: nothing is left STARTED or held."""
    app, _ = ladder
    client = redis_server.client()
    task_id = str(uuid.uuid4())
    client.set(keys.attempts(task_id), "not a list")
    result = app.poison_exit.apply_async(task_id=task_id)
    with pytest.raises(sluice.WorkerLost, match="could not decide a retry"):
        result.get(timeout=60)
    wait_for(lambda: all(h.task_id != task_id for h in RedisLayout().held(client)), 10, "the message to be acknowledged")
    assert len(runs(client, task_id)) == 1
