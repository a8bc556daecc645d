"""README promises that had no test, each checked with real parts: the session's redis-server (or a
private one where the test stops or reconfigures Redis), real worker subprocesses, real
SIGSTOP/SIGKILL. One worker, ``alpha`` (cpu, one slot, fast recovery), serves the whole module;
a test that needs a worker to freeze or kill starts its own beside it."""

from __future__ import annotations

import base64
import importlib
import json
import os
import pickle
import signal
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError

from sluice import App
from sluice.deploy.embedded import EmbeddedRedis
from sluice.deploy.metrics import ClassMetrics
from sluice.queues.broker import letters, scripts
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.broker.letters import DEAD_LETTER_CAP, DeadLetter
from tests.conftest import Workers, wait_for

pytestmark = pytest.mark.integration

APP = "tests.apps.promises"
TASK = APP + "."
FAST_RECOVERY = {"SLUICE_HEARTBEAT_INTERVAL": "0.2", "SLUICE_REAPER_INTERVAL": "0.5", "SLUICE_ORPHAN_GRACE": "2"}
ARGS = ("-c", "1", "--without-mingle", "--without-gossip")
LAYOUT = RedisLayout()


@dataclass
class Cluster:
    client: redis.Redis
    workers: Workers
    plain: Celery        #: a plain Celery client with Celery's defaults (queue "celery")
    tasks: ModuleType    #: tests.apps.promises, bound to the session's Redis

    def runs(self, task_id: str) -> list[str]:
        """Executions of a task's body, as the body recorded them: "<worker> <attempt>"."""
        return [run.decode() for run in self.client.lrange(self.tasks.runs_key(task_id), 0, -1)]


@pytest.fixture(scope="module")
def cluster(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    client = redis_server.client()
    client.flushdb()   # what earlier modules left (no test here flushes while alpha runs)
    tasks = importlib.import_module(APP)
    pool = Workers(client, tmp_path_factory.mktemp("promises"))
    try:
        pool.start(APP, "cpu", "alpha", *ARGS, env=FAST_RECOVERY)
        yield Cluster(client, pool, Celery("plain", broker=redis_server.url, backend=redis_server.url), tasks)
    finally:
        pool.stop_all()


@contextmanager
def alpha_busy(cluster: Cluster, release: Path) -> Iterator[Any]:
    """alpha's one slot taken by a task that holds it until ``release`` exists (made on exit)."""
    held = cluster.tasks.hold.delay(str(release))
    try:
        wait_for(lambda: cluster.runs(held.id) == ["alpha@test 1"], 30, "alpha to start the holding task")
        yield held
    finally:
        release.touch()
    assert held.get(timeout=30)["worker"] == "alpha@test"


def dead_letter_of(client: redis.Redis, queue: str, task_id: str) -> DeadLetter | None:
    for raw in client.lrange(LAYOUT.dead_letters(queue), 0, -1):
        letter = DeadLetter.decode(raw)
        if letter.task_id == task_id:
            return letter
    return None


class _Opens:
    """Unpickling this creates the file: what a pickled message would run on a worker that unpickled it."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return open, (self.path, "w")


# -- 1. messages a worker must not run ------------------------------------------------------------

def test_a_pickled_message_on_a_class_queue_is_a_dead_letter_neither_unpickled_nor_run(
        cluster: Cluster, tmp_path: Path) -> None:
    """A pickle-serialized call of ``touch`` (a task alpha has) pushed onto the cpu queue: it ends
    on cpu's dead letters, content type intact; the file the task would write does not exist,
    nor the file unpickling its payload would create. Controls: unpickling the payload does
    create its file, and the same call JSON-encoded runs on alpha and writes the task's file."""
    ran, unpickled, control = tmp_path / "ran", tmp_path / "unpickled", tmp_path / "control"
    pickle.loads(pickle.dumps(_Opens(control)))
    assert control.exists(), "unpickling the payload would not have shown"
    pickled = cluster.plain.send_task(TASK + "touch", args=[str(ran)], kwargs={"payload": _Opens(unpickled)},
                                      queue="cpu", serializer="pickle")
    letter = wait_for(lambda: dead_letter_of(cluster.client, "cpu", pickled.id), 30,
                      "the pickled message's dead letter")
    assert not unpickled.exists() and not ran.exists() and cluster.runs(pickled.id) == []
    assert json.loads(letter.raw)["content-type"] == "application/x-python-serialize"
    assert letter.reason.startswith("invalid task message: ContentDisallowed"), letter.reason
    control_run = cluster.plain.send_task(TASK + "touch", args=[str(ran)], queue="cpu")
    assert control_run.get(timeout=30)["worker"] == "alpha@test"
    assert ran.exists() and not unpickled.exists()


@pytest.mark.parametrize("header, value", [("eta", "not-a-date"), ("expires", "never")])
def test_a_message_celery_refuses_as_invalid_is_a_dead_letter_and_its_valid_twin_runs(
        cluster: Cluster, tmp_path: Path, header: str, value: str) -> None:
    """A real ``touch`` message with one header Celery cannot read (an ETA or expiry that is no
    time), pushed onto the cpu queue, is refused by Celery as an invalid task and kept as a dead
    letter naming why; the task's file is not written. Control: the same message without the bad
    header runs."""
    ran = tmp_path / "ran"
    parking = f"promises-parking-{uuid.uuid4()}"   # consumed by nobody: a real message to copy
    cluster.plain.send_task(TASK + "touch", args=[str(ran)], queue=parking)
    message = json.loads(cluster.client.rpop(parking))

    def pushed(**headers: str) -> str:
        task_id = str(uuid.uuid4())
        copy = {**message, "headers": {**message["headers"], "id": task_id, "root_id": task_id, **headers},
                "properties": {**message["properties"], "correlation_id": task_id, "delivery_tag": str(uuid.uuid4()),
                               "delivery_info": {"exchange": "", "routing_key": "cpu"}}}
        cluster.client.lpush("cpu", json.dumps(copy))
        return task_id

    bad = pushed(**{header: value})
    letter = wait_for(lambda: dead_letter_of(cluster.client, "cpu", bad), 30, "the invalid message's dead letter")
    assert letter.reason.startswith("invalid task message: InvalidTaskError"), letter.reason
    assert value in letter.reason and not ran.exists() and cluster.runs(bad) == []
    good = pushed()
    assert cluster.plain.AsyncResult(good).get(timeout=30)["worker"] == "alpha@test"
    assert ran.exists() and dead_letter_of(cluster.client, "cpu", good) is None


# -- 2. the dead-letter cap and its counter -------------------------------------------------------

def test_dead_letters_keep_the_newest_10000_and_the_metric_counts_every_one(tmp_path: Path) -> None:
    """10,050 messages that are not JSON on the highmem queue, taken by the transport's own fetch
    script (which dead-letters up to 100 per call), then one more kept by the Python path a
    worker's consumer uses: the list holds exactly the newest 10,000, newest first, and
    ``sluice_dead_letters_total{resource_class="highmem"}`` says 10,051."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        client = server.client()
        total = DEAD_LETTER_CAP + 50
        garbage = [f"not json {n}".encode() for n in range(total)]
        for start in range(0, total, 1000):
            client.lpush("highmem", *garbage[start:start + 1000])   # fetched oldest first
        app = App("tests.promises.cap", broker=server.url)
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            scripts.load(channel.client, "fetch")
            for _ in range(total // 100 + 2):
                if not client.llen("highmem"):
                    break
                dead = channel.client.execute_command(*channel._fetch_command(["highmem"]))
                assert dead[0] > 0 and len(dead) == 1, dead   # dead letters only: nothing there is a message
                channel._acks_in_flight = 0
        assert client.llen("highmem") == 0
        kept = [DeadLetter.decode(raw) for raw in client.lrange(LAYOUT.dead_letters("highmem"), 0, -1)]
        assert [letter.raw for letter in kept] == garbage[-DEAD_LETTER_CAP:][::-1]
        assert {letter.reason for letter in kept} == {"not JSON"}
        last = DeadLetter.now("the consumer's path", "highmem", b"one more")
        letters.dead_letter(client, LAYOUT, last)
        kept = client.lrange(LAYOUT.dead_letters("highmem"), 0, -1)
        assert len(kept) == DEAD_LETTER_CAP
        assert DeadLetter.decode(kept[0]).raw == b"one more" and DeadLetter.decode(kept[-1]).raw == garbage[-9_999]
        families = {family.name: family for family in ClassMetrics(client, app.catalog).collect()}
        samples = {s.labels["resource_class"]: s.value for s in families["sluice_dead_letters"].samples
                   if s.name == "sluice_dead_letters_total"}
        assert samples == {"cpu": 0, "highmem": total + 1, "gpu": 0}
    finally:
        server.stop()


# -- 3, 4. publishing: NOREPLICAS raises, an outage is waited out ---------------------------------

def _sender(server: EmbeddedRedis) -> Any:
    app = App("tests.promises.sender", broker=server.url)

    @app.task(shared=False)
    def noop(n: int) -> int:
        return n

    return noop


def test_a_delay_that_redis_refuses_with_noreplicas_raises_and_queues_nothing(tmp_path: Path) -> None:
    """A master with ``min-replicas-to-write 1`` and no replica refuses writes: ``.delay()``
    raises (kombu's OperationalError naming NOREPLICAS) at once instead of losing the call in
    silence, and nothing is queued. Control: the same call once the setting is lifted is queued."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        client = server.client()
        noop = _sender(server)
        noop.delay(0)   # a warm connection, as a running client has
        client.delete("cpu")
        client.config_set("min-replicas-to-write", 1)
        with pytest.raises(redis.ResponseError, match="NOREPLICAS"):
            client.set("probe", 1)   # the setting bites
        with pytest.raises(OperationalError, match="NOREPLICAS"):
            noop.delay(1)
        assert client.llen("cpu") == 0
        client.config_set("min-replicas-to-write", 0)
        sent = noop.delay(2)
        assert [json.loads(m)["headers"]["id"] for m in client.lrange("cpu", 0, -1)] == [sent.id]
    finally:
        server.stop()


def test_a_delay_during_a_redis_outage_blocks_and_is_queued_once_redis_is_back(tmp_path: Path) -> None:
    """Redis stopped; ``.delay()`` called in a thread is still waiting a second later (it has
    neither returned nor raised); Redis started again on the same port: the call returns its
    result handle and that task's message is on the queue, once."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        client = server.client()
        noop = _sender(server)
        noop.delay(0)
        client.delete("cpu")
        server.stop()
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["result"] = noop.delay(1)
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                outcome["error"] = exc

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(1.0)
        assert caller.is_alive() and outcome == {}, f"the call did not wait out the outage: {outcome}"
        server.start()
        caller.join(60)
        assert not caller.is_alive() and "error" not in outcome, outcome
        assert [json.loads(m)["headers"]["id"] for m in client.lrange("cpu", 0, -1)] == [outcome["result"].id]
    finally:
        server.stop()


# -- 5. a frozen worker ---------------------------------------------------------------------------

def test_a_sigstopped_workers_task_comes_back_to_another_worker_and_runs_there(cluster: Cluster,
                                                                                tmp_path: Path) -> None:
    """A worker is SIGSTOPped (main process and pool child) while it runs attempt 1 of a task with
    a TRANSIENT retry policy: it stops beating, alpha's reaper puts the message back, and alpha
    runs attempt 2 to a result. The body ran twice, once on each worker."""
    with alpha_busy(cluster, tmp_path / "alpha-free"):   # so the task goes to the frozen worker
        victim = cluster.workers.start(APP, "cpu", "frozen", *ARGS, env=FAST_RECOVERY)
        result = cluster.tasks.hold_again.delay(str(tmp_path / "never"))
        wait_for(lambda: cluster.runs(result.id) == ["frozen@test 1"], 30, "the frozen worker to start it")
        os.killpg(victim.pid, signal.SIGSTOP)
    try:
        assert result.get(timeout=30) == {"worker": "alpha@test", "attempt": 2, "queue": "cpu"}
        assert cluster.runs(result.id) == ["frozen@test 1", "alpha@test 2"]
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(10)


# -- 6. the intake waits for a free slot ----------------------------------------------------------

def test_a_worker_with_every_slot_busy_leaves_intake_messages_queued_until_one_frees(cluster: Cluster,
                                                                                     tmp_path: Path) -> None:
    """alpha (one slot) runs a task that holds its slot; a plain Celery client publishes a task to
    the intake (queue ``celery``). For 3 s (three times the 1 s within which a worker finds a
    message from a client that does not ring) the message stays on the intake, untaken and
    unrun. Once the slot frees, alpha takes it, forwards it to cpu and runs it."""
    ran = tmp_path / "ran"
    with alpha_busy(cluster, tmp_path / "alpha-free"):
        intake = cluster.plain.send_task(TASK + "touch", args=[str(ran)])
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            assert LAYOUT.waiting_task_ids(cluster.client, "celery") == {intake.id}
            assert [h for h in LAYOUT.held(cluster.client) if h.queue == "celery"] == []
            assert not ran.exists()
            time.sleep(0.1)
    assert intake.get(timeout=30) == {"worker": "alpha@test", "attempt": 1, "queue": "cpu"}
    assert ran.exists()


# -- 7. add_consumer ------------------------------------------------------------------------------

def test_add_consumer_of_a_class_bigger_than_the_worker_is_refused(cluster: Cluster) -> None:
    """Celery's ``add_consumer highmem`` to alpha (a cpu worker: 1 cpu, 2Gi slots) is refused: the
    worker logs why and does not consume highmem. Control: ``add_consumer`` of a queue that is no
    class, sent after it, is taken (so the first was handled, and refused)."""
    side = f"promises-side-{uuid.uuid4()}"
    cluster.plain.control.add_consumer("highmem", destination=["alpha@test"])
    cluster.plain.control.add_consumer(side, destination=["alpha@test"])

    def queues() -> set[str]:
        reply = cluster.plain.control.inspect(destination=["alpha@test"], timeout=5).active_queues() or {}
        return {queue["name"] for queue in reply.get("alpha@test", [])}

    try:
        consumed = wait_for(lambda: (found := queues()) and side in found and found, 30,
                            "alpha to consume the side queue")
        assert "highmem" not in consumed and "cpu" in consumed
        refusal = "not consuming from highmem: class highmem has slots of cpu=4 memory=64Gi"
        assert refusal in cluster.workers.log("alpha")
    finally:
        cluster.plain.control.cancel_consumer(side, destination=["alpha@test"])
        cluster.plain.control.cancel_consumer("highmem", destination=["alpha@test"])


# -- 8. delay_many's fallbacks --------------------------------------------------------------------

def test_delay_many_in_eager_mode_runs_each_call_in_process_and_get_returns_their_values(
        cluster: Cluster, tmp_path: Path) -> None:
    """The promise is about Celery's eager mode itself (no worker stands in for anything here):
    an app configured with ``task_always_eager``, as a user's test settings would, runs each
    ``delay_many`` call in this process before it returns (its file is written, by no worker),
    queues nothing, and the BulkResult's ``get()`` and ``as_completed()`` return the calls'
    values, as ``.delay().get()`` does. Its own App: the module's shared one is left as it is."""
    paths = [str(tmp_path / f"eager-{n}") for n in range(3)]
    eager = App("tests.promises.eager")
    eager.conf.task_always_eager = True

    @eager.task(name=TASK + "eager_touch", shared=False)
    def touch(path: str) -> str:
        Path(path).write_text("ran")
        return f"ran in {os.getpid()}"

    bulk = touch.delay_many(paths, progress=False)
    assert [Path(p).exists() for p in paths] == [True] * 3
    assert LAYOUT.queue_depth(cluster.client, "cpu") == 0
    alone = touch.delay(str(tmp_path / "eager-alone")).get(timeout=10)
    assert alone == f"ran in {os.getpid()}"                                  # ran here, in this process
    assert bulk.get(timeout=10) == [alone] * 3
    assert sorted(index for index, _ in bulk.as_completed(timeout=10, progress=False)) == [0, 1, 2]


def test_delay_many_with_compression_sends_each_call_compressed_as_apply_async_does(cluster: Cluster,
                                                                                   tmp_path: Path) -> None:
    """With ``task_compression = "zlib"`` every call goes through ``apply_async``: each queued
    message carries the compression header ``apply_async``'s does and a zlib-compressed body holding its own
    arguments, as the one ``apply_async`` sends; alpha runs each of them to its value."""
    paths = [str(tmp_path / f"zlib-{n}") for n in range(3)]
    # a sender configured with compression from the start, as a user would (Celery reads the
    # setting once, when the app first publishes): touch under its name, for alpha to run
    zipped = App("tests.promises.zlib")
    zipped.conf.task_compression = "zlib"

    @zipped.task(name=TASK + "touch", shared=False)
    def touch(path: str, payload: Any = None) -> None: ...

    with alpha_busy(cluster, tmp_path / "alpha-free"):   # the messages stay queued to be read
        bulk = touch.delay_many(paths, progress=False)
        reference = touch.apply_async((str(tmp_path / "zlib-reference"),))
        queued = {m["headers"]["id"]: m for m in map(json.loads, cluster.client.lrange("cpu", 0, -1))}
        assert set(queued) == {*bulk.ids, reference.id}
        assert queued[reference.id]["headers"]["compression"] == "application/x-gzip"   # kombu's name for zlib
        for task_id, path in zip(bulk.ids, paths, strict=True):
            message = queued[task_id]
            assert message["headers"]["compression"] == queued[reference.id]["headers"]["compression"]
            args = json.loads(zlib.decompress(base64.b64decode(message["body"])))[0]
            assert args == [path]
    assert [value["worker"] for value in bulk.get(timeout=30)] == ["alpha@test"] * 3
    assert all(Path(p).exists() for p in paths)


# -- 9. the at-least-once window ------------------------------------------------------------------

def test_a_worker_killed_after_the_body_returned_before_its_result_was_stored_runs_it_again_once(
        cluster: Cluster, tmp_path: Path) -> None:
    """The window the README names: a task (TRANSIENT retry policy) whose body has returned is
    publishing its link callback, which Celery does before it stores the result; the worker's
    test app blocks there, and the worker is SIGKILLed. alpha's reaper puts the message back and
    alpha runs the body again: two executions counted at the source, and one result, SUCCESS,
    from the second."""
    with alpha_busy(cluster, tmp_path / "alpha-free"):
        victim = cluster.workers.start(APP, "cpu", "window", *ARGS, env={**FAST_RECOVERY, "PROMISES_BLOCK_LINK": "1"})
        result = cluster.tasks.returns_then_links.apply_async(link=cluster.tasks.after_window.si())
        try:
            wait_for(lambda: cluster.client.exists(cluster.tasks.reached_key(result.id)), 30,
                     "the body to return and the link's publish to block")
            assert cluster.runs(result.id) == ["window@test 1"]
            assert result.state == "STARTED", "the result was stored: not the window"
        finally:
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(10)
    assert result.get(timeout=30) == {"worker": "alpha@test", "attempt": 2, "queue": "cpu"}
    assert cluster.runs(result.id) == ["window@test 1", "alpha@test 2"]
    assert result.state == "SUCCESS"
