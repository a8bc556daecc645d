"""Redis Sentinel: a `sentinel://` broker for workers, `.delay()` and a batch run, and a master
failover (kill -9, the replica promoted) that loses nothing that was replicated: real
redis-server processes, three real Sentinels, real workers."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sluice import App, redis_client
from sluice.config import Settings
from tests.conftest import ROOT, Workers, wait_for
from tests.sentinel import MASTER_NAME, SentinelCluster

pytestmark = pytest.mark.integration

COUNTING = ROOT / "tests" / "tasks" / "counting.py"
TASK = "tests.apps.basic.default_task"
SLEEPER = "tests.apps.basic.sleeper"


def test_a_master_failover_loses_nothing_replicated_and_everything_goes_on(tmp_path: Path) -> None:
    """Workers, `.delay()` and a `sluice compute` run on a Sentinel broker; the master is killed
    (-9) once every write so far reached the replica, with 30 tasks queued or running; `.delay()`
    calls made after the kill, before the promotion, block and go through to the new master;
    every one of those 40 tasks and 30 sent after ends in a result. Counted at the source, the
    batch run executed every id, and an id ran again only if its first run ended less than 1 s
    before the replication check (a result written later may be on the old master alone); the
    sink holds each id once. Prints the counts and the time from the kill to the first task
    completed on the new master."""
    done, gate = tmp_path / "done", tmp_path / "gate"
    done.mkdir()
    with SentinelCluster(tmp_path / "sentinel") as cluster:
        env = {"SLUICE_BROKER_URL": cluster.url, "SLUICE_SENTINEL_MASTER": MASTER_NAME, "SLUICE_HOME": str(tmp_path),
               "PYTHONPATH": str(ROOT)}
        settings = Settings.load(env=env)
        client = redis_client.connect(cluster.url, settings=settings)
        pool = Workers(client, tmp_path)
        sender = App("tests.sentinel.sender", broker=cluster.url, settings=settings)
        sink = tmp_path / "sink"
        try:
            pool.start("tests.apps.basic", "cpu", "cpu", "--without-mingle", "--without-gossip", env=env)
            driver = subprocess.Popen(
                [sys.executable, "-m", "sluice", "compute", str(COUNTING), "-w", "1", "--retries", "3", "--sink",
                 str(sink), "--", "--n", "300", "--sleep", "0.02", "--done", str(done), "--gate", str(gate),
                 "--gate-from", "200"],
                cwd=ROOT, env=os.environ | env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_for(lambda: _lines(sink / "ready.ndjson") >= 100, 60, "the batch run to be under way")
            before = [sender.send_task(SLEEPER, args=[0.3]) for _ in range(30)]
            old_master = cluster.master_port()
            offset = cluster.client("master").info("replication")["master_repl_offset"]
            wait_for(lambda: _replica_offset(cluster) >= offset, 30, "the replica to have every write so far")
            replicated_at = time.time()
            in_flight = sum(not r.ready() for r in before)
            killed = cluster.kill_master()
            across: list[Any] = []
            sending = threading.Thread(target=lambda: across.extend(sender.send_task(TASK) for _ in range(10)),
                                       daemon=True)
            sending.start()
            wait_for(lambda: cluster.master_port() not in (None, old_master), 60, "the Sentinels to promote the replica")
            promoted = time.monotonic()
            gate.touch()   # items 200 and up waited for it: the run surely spans the failover
            sending.join(60)
            assert not sending.is_alive() and len(across) == 10, "the .delay() calls across the failover did not return"
            after = [sender.send_task(TASK) for _ in range(30)]
            first = after[0].get(timeout=100)
            recovered = time.monotonic() - killed
            outcomes = [r.get(timeout=60) for r in [*before, *across, *after[1:]]] + [first]
            assert all(o["queue"] == "cpu" for o in outcomes)
            _, err = driver.communicate(timeout=100)
            assert driver.returncode == 0, err[-3000:]
        finally:
            if driver.poll() is None:
                driver.kill()
            pool.stop_all()
        assert in_flight > 0, "every task sent before the kill had ended: none was in flight across it"
        ids = [i for i in (json.loads(line)["id"] for line in (sink / "ready.ndjson").read_text().splitlines())
               if i.startswith("item-")]   # the plan's one id-less item gets a UUID
        ends: dict[str, list[float]] = {}
        for path in done.iterdir():
            for line in path.read_text().splitlines():
                item_id, at = line.split()
                ends.setdefault(item_id, []).append(float(at))
        executed = {f"item-{i}" for i in range(300)} & set(ends)
        again = {i: min(at) for i, at in ends.items() if len(at) > 1}
        unexplained = {i: round(replicated_at - at, 2) for i, at in again.items() if at < replicated_at - 1.0}
        print(f"sentinel failover: {300 - len(executed)} ids never executed, {len(again)} executed twice "
              f"({len(unexplained)} of them done before the replication check), {in_flight} of 30 tasks in flight "
              f"at the kill; first task completed {recovered:.1f} s after the kill, the promotion seen after "
              f"{promoted - killed:.1f} s")
        assert len(executed) == 300 and sorted(ids) == sorted(set(ids)) and len(ids) == 300
        assert unexplained == {}, f"ids whose replicated result was lost and run again: {unexplained}"
        assert cluster.master_port() == cluster.ports["replica"]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _replica_offset(cluster: SentinelCluster) -> int:
    return int(cluster.client("master").info("replication").get("slave0", {}).get("offset", -1))


def test_the_autoscaler_goes_on_reading_the_queues_through_a_failover(tmp_path: Path) -> None:
    """The built-in autoscaler's one Redis client (the one every sluice command builds) reads a
    class's queue before a failover and, after the master is killed and the replica promoted,
    from the new master: its next tick scales on the queue as it is there, without a restart.
    The kubernetes side is the HTTP fake (no API server runs here)."""
    from kubernetes import client as k8s

    from sluice.deploy.autoscaler import Autoscaler
    from tests.kube_fake import FakeKube

    scaling = importlib.import_module("tests.apps.scaling")
    with SentinelCluster(tmp_path / "sentinel") as cluster, FakeKube() as fake:
        settings = Settings.load(env={"SLUICE_SENTINEL_MASTER": MASTER_NAME, "SLUICE_HOME": str(tmp_path)})
        client = redis_client.connect(cluster.url, settings=settings)
        sender = App("tests.sentinel.scaler", broker=cluster.url, settings=settings, classes=list(scaling.app.catalog))
        fake.add_deployment("t", "sluice-worker-batch", 0)
        api = k8s.ApiClient(k8s.Configuration(host=fake.url))
        scaler = Autoscaler(client, scaling.app.catalog, k8s.AppsV1Api(api), k8s.CoreV1Api(api), "t", sender.control,
                            cooldown=0)
        for _ in range(2):
            sender.send_task("tests.apps.scaling.work", args=[0.01], queue="batch")
        assert scaler.tick() == {"batch": 2}
        offset = cluster.client("master").info("replication")["master_repl_offset"]
        wait_for(lambda: _replica_offset(cluster) >= offset, 30, "the replica to have every write so far")
        old_master = cluster.master_port()
        cluster.kill_master()
        wait_for(lambda: cluster.master_port() not in (None, old_master), 60, "the Sentinels to promote the replica")
        sender.send_task("tests.apps.scaling.work", args=[0.01], queue="batch")
        assert scaler.tick() == {"batch": 3}
        assert cluster.master_port() == cluster.ports["replica"]


def test_a_worker_killed_after_a_failover_has_its_task_recovered_by_the_reaper(tmp_path: Path) -> None:
    """A task is running when the master is killed; its worker is SIGKILLed right after, and the
    replica is promoted. The reaper of the worker started in its place, talking to the new master,
    finds the dead worker's held message (its heartbeat stopped) and the task's retry policy
    runs it again, escalated: it ends in a result, its body completed once."""
    ladder = importlib.import_module("tests.apps.ladder")
    with SentinelCluster(tmp_path / "sentinel") as cluster:
        env = {"SLUICE_BROKER_URL": cluster.url, "SLUICE_SENTINEL_MASTER": MASTER_NAME, "SLUICE_HOME": str(tmp_path),
               "PYTHONPATH": str(ROOT), "SLUICE_HEARTBEAT_INTERVAL": "0.2", "SLUICE_REAPER_INTERVAL": "0.5"}
        settings = Settings.load(env=env)
        client = redis_client.connect(cluster.url, settings=settings)
        pool = Workers(client, tmp_path)
        sender = App("tests.sentinel.ladder", broker=cluster.url, settings=settings, classes=list(ladder.app.catalog),
                     default_compute=ladder.app.default_compute)
        args = ("--queue", "medium", "--queue", "large", "-c", "2", "--without-mingle", "--without-gossip")
        try:
            victim = pool.start("tests.apps.ladder", "small", "victim", *args, env=env)
            result = sender.send_task("tests.apps.ladder.long_step", args=[3.0], queue="small")
            wait_for(lambda: client.exists(f"test:running:{result.id}:1"), 60, "the first attempt to start")
            offset = cluster.client("master").info("replication")["master_repl_offset"]
            wait_for(lambda: _replica_offset(cluster) >= offset, 30, "the replica to have every write so far")
            old_master = cluster.master_port()
            cluster.kill_master()
            # the worker dies with the master (a node lost), while its 3 s task surely still runs: a
            # failover can take longer than the task, which would then have ended on attempt 1
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(30)
            wait_for(lambda: cluster.master_port() not in (None, old_master), 60, "the Sentinels to promote the replica")
            pool.start("tests.apps.ladder", "small", "heir", *args, env=env, wait=False)
            assert result.get(timeout=90)["attempt"] == 2
            assert client.get(f"test:completed:{result.id}") == b"1"
            assert client.lrange(f"test:runs:{result.id}", 0, -1) == [b"small", b"medium"]
        finally:
            pool.stop_all()
