"""Routing and resource limits hold whoever sends the task: the task catalog routes what a sender
has not imported, the intake takes plain Celery clients' tasks, and admission on the worker
forwards what its class cannot hold. Real redis-server, real workers on a small ladder
(small 150Mi, big 600Mi, gpu 600Mi + 1 gpu; no gpu worker, as on a cluster whose gpu pool is
empty)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery import Celery

import sluice
from sluice import App, keys
from sluice.deploy.embedded import EmbeddedRedis
from sluice.deploy.metrics import ClassMetrics
from sluice.errors import NoQueueFits
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.broker.letters import DeadLetter
from tests.apps import admission
from tests.conftest import ROOT, Workers, seeded_random, wait_for

pytestmark = pytest.mark.integration

APP = "tests.apps.admission"
TASK = "tests.apps.admission."
FAST = {"SLUICE_HEARTBEAT_INTERVAL": "0.2", "SLUICE_REAPER_INTERVAL": "0.5", "SLUICE_ORPHAN_GRACE": "2"}
ARGS = ("--without-mingle", "--without-gossip")
LAYOUT = RedisLayout()


@dataclass
class Cluster:
    server: EmbeddedRedis
    client: redis.Redis
    workers: Workers
    plain: Celery   #: a plain Celery client with Celery's defaults (queue "celery")
    env: dict[str, str]

    def forwarded(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.client.hgetall(keys.FORWARDED).items()}


def _cluster(tmp: Path) -> Cluster:
    server = EmbeddedRedis(tmp / "redis").start()
    client = server.client()
    env = {"SLUICE_BROKER_URL": server.url, **FAST}
    return Cluster(server, client, Workers(client, tmp), Celery("plain", broker=server.url, backend=server.url), env)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Its own Redis (the ladder differs from other tests' apps) with a small and a big worker."""
    running = _cluster(tmp_path_factory.mktemp("admission"))
    try:
        running.workers.start(APP, "small", "small", *ARGS, env=running.env)
        running.workers.start(APP, "big", "big", *ARGS, env=running.env)
        yield running
    finally:
        running.workers.stop_all()
        running.server.stop()


def _grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def test_plain_celery_send_task_runs_each_task_on_the_class_that_fits_it(cluster: Cluster) -> None:
    """Celery's defaults publish to queue "celery": the intake. A default-sized task and a 400Mi
    task each run once, on small and on big, each forwarded once from the intake."""
    before = cluster.forwarded()
    small = cluster.plain.send_task(TASK + "where")
    wide = cluster.plain.send_task(TASK + "wide")
    assert small.get(timeout=30)["queue"] == "small"
    assert wide.get(timeout=30)["queue"] == "big"
    assert _grew(before, cluster.forwarded()) == {"celery small": 1, "celery big": 1}
    assert cluster.client.lrange(f"test:ran:{wide.id}", 0, -1) == [b"big"]


def test_a_sluice_app_without_the_code_routes_by_the_task_catalog(cluster: Cluster,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The workers published their tasks: an App that never imported them sends the 400Mi task
    straight to big (no forward) and the gpu task to gpu, where it waits, visible; a name no
    worker registered goes to the default class with one warning and ends NotRegistered, kept."""
    sender = App("tests.other", broker=cluster.server.url, classes=admission.CLASSES)
    assert TASK + "wide" not in sender.tasks
    before = cluster.forwarded()
    wide = sender.send_task(TASK + "wide")
    assert wide.get(timeout=30)["queue"] == "big"
    assert _grew(before, cluster.forwarded()) == {}
    train = sender.send_task(TASK + "train")
    wait_for(lambda: train.id in LAYOUT.waiting_task_ids(cluster.client, "gpu"), 10, "the gpu task to wait on gpu")
    with caplog.at_level(logging.WARNING, logger="sluice.routing"):
        unknown = [sender.send_task("nobody.registered.this") for _ in range(2)]
    assert len([r for r in caplog.records if "nobody.registered.this" in r.getMessage()]) == 1
    for result in unknown:
        with pytest.raises(Exception, match="nobody.registered.this"):
            result.get(timeout=30)
    assert cluster.client.llen(keys.dead_letters("small")) >= 2


def test_a_misrouted_message_is_forwarded_and_an_explicit_queue_that_holds_it_wins(cluster: Cluster) -> None:
    """A 400Mi task published onto small (150Mi slots) is forwarded to big, with a log line and
    a count; a 100Mi task sent to big by name runs on big (big can hold it)."""
    before = cluster.forwarded()
    wide = cluster.plain.send_task(TASK + "wide", queue="small")
    assert wide.get(timeout=30)["queue"] == "big"
    chosen = cluster.plain.send_task(TASK + "where", queue="big")
    assert chosen.get(timeout=30)["queue"] == "big"
    assert _grew(before, cluster.forwarded()) == {"small big": 1}
    assert (f"task {TASK}wide[{wide.id}] needs cpu=1 memory=400Mi, class small holds cpu=1 memory=150Mi: "
            "forwarded to big") in cluster.workers.log("small")
    metrics = {(m.name, s.labels.get("from"), s.labels.get("to")): s.value
               for m in ClassMetrics(cluster.client, admission.app.catalog).collect() for s in m.samples}
    assert metrics[("sluice_forwarded", "small", "big")] >= 1


def test_a_sender_that_knows_the_task_cannot_name_a_queue_too_small_for_it() -> None:
    """Refused at publish, before anything is sent, naming the classes that hold it."""
    with pytest.raises(NoQueueFits, match="queue 'small' holds cpu=1 memory=150Mi; .*: big, gpu"):
        admission.wide.apply_async(queue="small")


def test_add_consumer_gpu_on_a_worker_without_a_gpu_leaves_gpu_tasks_queued_and_visible(cluster: Cluster) -> None:
    """`celery control add_consumer gpu` to the small worker (no GPU here) is refused by the
    worker; a gpu task sent afterwards stays PENDING on the gpu queue, and `sluice status`
    shows it there and the intake row."""
    cluster.plain.control.add_consumer("gpu", destination=["small@test"])
    wait_for(lambda: "not consuming from gpu: class gpu needs a GPU" in cluster.workers.log("small"), 15,
             "the worker to refuse the gpu queue")
    consumed = cluster.plain.control.inspect(destination=["small@test"], timeout=10).active_queues()
    assert consumed is not None and "gpu" not in {q["name"] for q in consumed["small@test"]}, consumed
    train = cluster.plain.send_task(TASK + "train", queue="gpu")
    # the small worker has fetched since the gpu task was sent: a task sent after it has run there
    assert cluster.plain.send_task(TASK + "where", queue="small").get(timeout=30)["queue"] == "small"
    assert train.state == "PENDING"
    assert train.id in LAYOUT.waiting_task_ids(cluster.client, "gpu")
    status = subprocess.run([sys.executable, "-m", "sluice", "status", "-A", APP], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env=os.environ | cluster.env | {"COLUMNS": "200"})
    assert status.returncode == 0, status.stderr
    gpu_row = next(line for line in status.stdout.splitlines() if line.strip("│ ").startswith("gpu "))
    assert int(gpu_row.split("│")[2]) >= 1, status.stdout          # queued, with no worker to run it
    assert "celery (intake)" in status.stdout and f"{TASK}wide" in status.stdout


def test_a_task_no_class_holds_fails_with_NoQueueFits_visible_to_its_caller(cluster: Cluster) -> None:
    result = cluster.plain.send_task(TASK + "where", headers={"sluice_compute": {"memory": "512Gi"}})
    with pytest.raises(NoQueueFits, match="no resource class fits .*where.*512Gi"):
        result.get(timeout=30)


def test_a_forwarded_task_keeps_its_retry_policy_and_escalation(cluster: Cluster) -> None:
    """From the intake to small, killed there for memory at 140Mi, escalated by its own policy
    to 280Mi on big, where it succeeds; the history shows both attempts."""
    result = cluster.plain.send_task(TASK + "grows", args=(200,))
    assert result.get(timeout=60)["queue"] == "big"
    assert cluster.client.lrange(f"test:ran:{result.id}", 0, -1) == [b"small", b"big"]
    reader = App("tests.reader", broker=cluster.server.url, classes=admission.CLASSES)
    killed, succeeded = sluice.attempts(reader.AsyncResult(result.id))
    assert (killed["reason"], killed["queue"], killed["compute"]["memory"]) == ("memory", "small", "140Mi")
    assert (succeeded["reason"], succeeded["queue"]) == ("succeeded", "big")


def test_a_worker_killed_while_forwarding_loses_nothing_and_forwards_nothing_twice(tmp_path: Path) -> None:
    """300 400Mi tasks published onto small; the small worker forwards them to big and is
    SIGKILLed three times while doing so (restarted each time). Every task succeeds on big,
    each body ran once, and each message was forwarded exactly once."""
    instants, seed = seeded_random("kill instants")
    run = _cluster(tmp_path)
    tasks = 300
    try:
        run.workers.start(APP, "big", "big", *ARGS, env=run.env)
        results = [run.plain.send_task(TASK + "wide", queue="small") for _ in range(tasks)]
        interrupted = []
        for round_ in range(3):
            waiting = LAYOUT.queue_depth(run.client, "small")
            victim = run.workers.start(APP, "small", f"victim{round_}", *ARGS, env=run.env, wait=False)
            if waiting:   # killed once it has begun forwarding, at a random point soon after
                wait_for(lambda: LAYOUT.queue_depth(run.client, "small") < waiting, 60,
                         "the victim to begin forwarding", interval=0.002)
                time.sleep(instants.uniform(0, 0.02))
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(30)
            interrupted.append(LAYOUT.queue_depth(run.client, "small"))
        assert interrupted[0] > 0, f"the first kill should land while messages still wait to be forwarded (seed {seed})"
        run.workers.start(APP, "small", "last", *ARGS, env=run.env)
        assert [r.get(timeout=120)["queue"] for r in results] == ["big"] * tasks, f"seed {seed}"
        runs = run.client.pipeline()
        for result in results:
            runs.lrange(f"test:ran:{result.id}", 0, -1)
        assert [r for r in runs.execute() if r != [b"big"]] == [], f"seed {seed}"
        assert run.forwarded() == {"small big": tasks}, f"seed {seed}"
    finally:
        run.workers.stop_all()
        run.server.stop()


def test_explain_without_an_app_reads_the_task_catalog(cluster: Cluster) -> None:
    """No code imported: the tasks, their sizes, policies and classes come from what the workers published."""
    explain = subprocess.run([sys.executable, "-m", "sluice", "explain"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, env=os.environ | cluster.env | {"COLUMNS": "250", "SLUICE_CLASSES": (
                                 '{"small": {"cpu": "1", "memory": "150Mi"}, "big": {"cpu": "1", "memory": "600Mi"}}')})
    assert explain.returncode == 0, explain.stderr
    grows = next(line for line in explain.stdout.splitlines() if f"{TASK}grows" in line)
    assert "memory=140Mi" in grows and "2 retries on OOM, memory x2 up to 600Mi" in grows and "small" in grows
    wide = next(line for line in explain.stdout.splitlines() if f"{TASK}wide" in line)
    assert "big" in wide and "@test" in wide      # routed by these settings' classes; published by a worker


def test_bad_sluice_headers_are_a_dead_letter_and_the_worker_serves_on(cluster: Cluster) -> None:
    """Headers admission must read (a compute that is not one, a forward trail that is not a
    list) arrive from the intake and from a class: each message is kept as a dead letter with
    the reason, and the same workers then run a good task."""
    bad = [cluster.plain.send_task(TASK + "where", headers={"sluice_compute": {"memory": "lots"}}),
           cluster.plain.send_task(TASK + "where", queue="small", headers={"sluice_forwarded": 42})]
    wanted = {r.id for r in bad}

    def kept() -> set[str]:
        letters = [DeadLetter.decode(raw) for queue in ("celery", "small")
                   for raw in cluster.client.lrange(keys.dead_letters(queue), 0, -1)]
        return {letter.task_id for letter in letters if "invalid sluice headers" in letter.reason} & wanted

    wait_for(lambda: kept() == wanted, 30, "both messages kept as dead letters")
    assert cluster.plain.send_task(TASK + "where").get(timeout=30)["queue"] == "small"
