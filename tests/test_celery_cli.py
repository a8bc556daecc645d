"""The celery command against a sluice cluster: ``celery -A app inspect|control|purge|status|
result|events`` run as a user runs them, against real sluice workers (tests/apps/basic.py: cpu,
highmem, gpu classes), each giving what it gives on stock Celery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from sluice import keys
from sluice.deploy.embedded import EmbeddedRedis
from sluice.queues.broker.layout import RedisLayout
from tests.conftest import ROOT, Workers, wait_for

pytestmark = pytest.mark.integration

APP = "tests.apps.basic"
NODE = "cli@test"


def celery(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.apps.basic ARGS`` in a subprocess, as typed in a shell."""
    return subprocess.run([sys.executable, "-m", "celery", "-A", APP, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)})


def inspect(command: str, *args: str) -> Any:
    """``celery inspect COMMAND --json``: the reply of this module's worker."""
    run = celery("inspect", command, *args, "--json", "--timeout", "5", "--destination", NODE)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)[NODE]


def inspect_until(command: str, holds: Callable[[Any], bool], timeout: float, what: str) -> Any:
    """The first reply of ``celery inspect COMMAND`` for which ``holds(reply)``; the test fails
    after ``timeout`` seconds, naming the last reply."""
    deadline = time.monotonic() + timeout
    while True:
        reply = inspect(command)
        if holds(reply):
            return reply
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}; last reply: {reply}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, Workers]]:
    """One sluice worker on the cpu class, two pool processes, task events on (``-E``, as
    ``sluice up`` starts workers for Flower)."""
    import importlib

    pool = Workers(redis_server.client(), tmp_path_factory.mktemp("celery-cli"))
    pool.start(APP, "cpu", "cli", "-c", "2", "-E", "--without-mingle", "--without-gossip")
    yield importlib.import_module(APP), pool
    pool.stop_all()


def test_inspect_active_scheduled_revoked_registered_and_stats_report_the_worker(
        cluster: tuple[ModuleType, Workers]) -> None:
    """With a countdown task waiting and both pool processes busy: ``inspect scheduled`` lists
    the countdown with its ETA, ``active`` the two running tasks (routing key: their class
    queue), ``revoked`` a revoked id, ``registered`` the app's tasks, ``stats`` the pool size."""
    app, _ = cluster
    later = app.double.apply_async((21,), countdown=12)
    wait_for(lambda: inspect("scheduled"), 15, "the worker to hold the countdown task")
    running = [app.sleeper.delay(8) for _ in range(2)]
    active = inspect_until("active", lambda reply: len(reply) == 2, 15, "both sleepers to run")
    waiting = app.double.delay(2)
    # a worker takes no more than it runs (prefetch 1, late acks): the third waits in Redis,
    # not in the worker's reserved list (Celery's default prefetch would have reserved it)
    wait_for(lambda: app.app.redis.llen("cpu") == 1, 5, "the third task to wait on the queue")
    assert inspect("reserved") == []
    assert sorted(task["id"] for task in active) == sorted(r.id for r in running)
    assert {(task["name"], task["delivery_info"]["routing_key"]) for task in active} == {
        (app.sleeper.name, "cpu")}
    scheduled, = inspect("scheduled")
    assert (scheduled["request"]["id"], scheduled["request"]["name"]) == (later.id, app.double.name)
    revoked = app.double.apply_async((1,), countdown=60)
    app.app.control.revoke(revoked.id)
    wait_for(lambda: revoked.id in inspect("revoked"), 10, "the revoke to reach the worker")
    assert {app.double.name, app.sleeper.name} <= set(inspect("registered"))
    assert inspect("stats")["pool"]["max-concurrency"] == 2
    assert later.get(timeout=30) == 42 and [r.get(timeout=30)["queue"] for r in running] == ["cpu", "cpu"]
    assert waiting.get(timeout=30) == 4


def test_control_adds_and_cancels_a_consumer_sets_limits_and_grows_the_pool(
        cluster: tuple[ModuleType, Workers]) -> None:
    """``celery control add_consumer reports`` makes the worker consume that queue (its
    ``active_queues`` says so) and ``cancel_consumer`` stops it; ``add_consumer highmem``, a
    class bigger than the worker, is acknowledged by Celery's reply but refused by the worker
    (logged, not consumed: the README's "add_consumer is refused"); ``rate_limit`` and
    ``time_limit`` are acknowledged and set on the task (``inspect registered`` shows them);
    ``pool_grow 1`` adds a pool process (``stats``: three processes), ``pool_shrink 1`` takes it
    back."""
    app, _ = cluster

    app, pool = cluster

    def control(*args: str) -> str:
        run = celery("control", *args, "--destination", NODE, "--timeout", "5")
        assert run.returncode == 0, run.stderr
        return run.stdout

    def consuming(*queues: str) -> None:
        """Wait for active_queues to name exactly these (Celery applies a change on the worker's
        next loop turn, after replying)."""
        inspect_until("active_queues", lambda reply: sorted(q["name"] for q in reply) == sorted(queues), 10,
                      f"the worker to consume {queues}")

    consuming("celery", "cli@test.dq2", "cpu")
    assert "add consumer reports" in control("add_consumer", "reports")
    consuming("celery", "cli@test.dq2", "cpu", "reports")
    assert "no longer consuming from reports" in control("cancel_consumer", "reports")
    consuming("celery", "cli@test.dq2", "cpu")
    assert "add consumer highmem" in control("add_consumer", "highmem")
    wait_for(lambda: "not consuming from highmem: class highmem has slots" in pool.log("cli"), 10,
             "the worker to refuse highmem")
    consuming("celery", "cli@test.dq2", "cpu")
    assert "new rate limit set successfully" in control("rate_limit", app.double.name, "120/m")
    assert "time limits set successfully" in control("time_limit", app.sleeper.name, "30", "60")
    limits = inspect("registered", "rate_limit", "soft_time_limit", "time_limit")
    assert f"{app.double.name} [rate_limit=120/m]" in limits
    assert f"{app.sleeper.name} [soft_time_limit=30.0 time_limit=60.0]" in limits, limits
    assert "pool will grow" in control("pool_grow", "1")
    inspect_until("stats", lambda stats: len(stats["pool"]["processes"]) == 3, 10, "a third pool process")
    assert "pool will shrink" in control("pool_shrink", "1")
    inspect_until("stats", lambda stats: len(stats["pool"]["processes"]) == 2, 10, "back to two pool processes")


def test_purge_empties_every_class_queue_with_its_priority_lists_and_says_how_many(
        cluster: tuple[ModuleType, Workers], redis_server: EmbeddedRedis) -> None:
    """Messages waiting on a class no worker serves (highmem; priorities 0, 5 and 9, so kombu's
    priority sub-lists, and one a plain producer sent to the intake, which the worker forwards
    there): ``celery purge -f`` removes every one and names the count and the queues it knows
    (each class and the intake; stock Celery knows only its default queue)."""
    app, _ = cluster
    client = redis_server.client()
    for priority in (0, 5, 9):
        app.big_task.apply_async(priority=priority)
    app.app.send_task(app.big_task.name, queue="celery")
    wait_for(lambda: RedisLayout().queue_depth(client, "highmem") == 4, 10, "four messages on highmem")
    run = celery("purge", "-f")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "Purged 4 messages from 4 known task queues.", run.stdout
    assert all(RedisLayout().queue_depth(client, queue) == 0 for queue in ("highmem", "gpu", "cpu", "celery"))
    assert not [key for key in client.keys("highmem*") if client.type(key) == b"list"]
    again = celery("purge", "-f")
    assert again.stdout.strip() == "No messages purged from 4 queues.", again.stdout


def test_status_lists_the_node_and_result_prints_a_stored_result(cluster: tuple[ModuleType, Workers]) -> None:
    """``celery status`` names the worker; ``celery result ID`` prints a finished task's value,
    and ``--traceback`` a failed one's traceback."""
    app, _ = cluster
    status = celery("status")
    assert status.returncode == 0 and f"->  {NODE}: OK" in status.stdout and "1 node online." in status.stdout
    done = app.double.delay(21)
    failed = app.double.delay(-1)
    assert done.get(timeout=30) == 42
    with pytest.raises(ValueError):
        failed.get(timeout=30)
    assert celery("result", done.id).stdout.strip() == "42"
    traceback = celery("result", "--traceback", failed.id).stdout
    assert "ValueError: negative: -1" in traceback


def test_events_dump_shows_a_tasks_life_on_the_worker(cluster: tuple[ModuleType, Workers]) -> None:
    """``celery events --dump`` prints the task-sent event of the caller and the received,
    started and succeeded events of the worker (started with ``-E``, in that order) for one task."""
    app, _ = cluster
    dump = subprocess.Popen([sys.executable, "-m", "celery", "-A", APP, "events", "--dump"], cwd=ROOT,
                            env=os.environ | {"PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []  # read by a thread: a readline() here could block past any timeout
    threading.Thread(target=lambda: lines.extend(iter(dump.stdout.readline, "")) if dump.stdout else None,
                     daemon=True).start()
    try:
        # "starting capture" is printed before the receiver subscribes: an event published in
        # between is lost to it (pub/sub), so wait for the first event it receives, a heartbeat
        wait_for(lambda: any(f"{NODE} [" in line for line in lines), 20, "celery events to receive a heartbeat")
        result = app.double.delay(4)
        assert result.get(timeout=30) == 8
        wanted = ("task sent", "task received", "task started", "task succeeded")
        # all four: the caller's task-sent event may come after the worker's (they are
        # published on different connections)
        wait_for(lambda: all(any(w in line and result.id in line for line in lines) for w in wanted), 20,
                 "the task's four events")
    finally:
        dump.kill()
        dump.wait(10)
    seen = [line for line in lines if result.id in line]
    kinds = [next(w for w in wanted if w in line) for line in seen]
    assert sorted(kinds) == sorted(wanted)
    assert [kind for kind in kinds if kind != "task sent"] == list(wanted[1:])  # the worker's, in order
    succeeded = next(line for line in seen if "task succeeded" in line)
    assert succeeded.startswith(f"{NODE} [") and "result=8" in succeeded


def test_a_plain_celery_worker_without_queues_consumes_the_default_class_the_intake_and_its_own_queue(
        cluster: tuple[ModuleType, Workers], redis_server: EmbeddedRedis,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """``celery -A app worker`` with no ``-Q``: the default class (cpu), the intake and its
    direct queue, not every class the App knows (which ``celery purge`` reads)."""
    app, _ = cluster
    assert sorted(app.app.amqp.queues) == ["celery", "cpu", "gpu", "highmem"]
    pool = Workers(redis_server.client(), tmp_path_factory.mktemp("plain"))
    try:
        pool.start(APP, None, "plain", "--without-mingle", "--without-gossip", plain_celery=True)
        reply = json.loads(celery("inspect", "active_queues", "--json", "--destination", "plain@test").stdout)
        assert sorted(queue["name"] for queue in reply["plain@test"]) == ["celery", "cpu", "plain@test.dq2"]
    finally:
        pool.stop_all()


def test_control_shutdown_stops_the_named_worker_cleanly(cluster: tuple[ModuleType, Workers],
                                                         redis_server: EmbeddedRedis,
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    """``celery control shutdown -d NODE`` stops that worker (a warm shutdown: exit status 0,
    its sluice heartbeat removed) and no other; the command itself ends as on stock Celery,
    where a worker sends no reply to shutdown."""
    pool = Workers(redis_server.client(), tmp_path_factory.mktemp("shutdown"))
    try:
        worker = pool.start(APP, "cpu", "down", "--without-mingle", "--without-gossip")
        run = celery("control", "shutdown", "--destination", "down@test", "--timeout", "5")
        # a worker does not reply to shutdown: Celery's command says so and exits 69, as on stock Celery
        assert (run.returncode, run.stderr.strip()) == (69, "Error: No nodes replied within time constraint")
        assert worker.wait(30) == 0, pool.log("down")
        assert not redis_server.client().exists(keys.worker_heartbeat("down@test"))
        assert f"->  {NODE}: OK" in celery("status").stdout
    finally:
        pool.stop_all()
