"""A worker told to stop stops: idle, it exits within seconds even with its Redis gone; with a
task running it keeps its heartbeat until the task ends (so no peer's reaper runs it again), then
exits. And `sluice up` takes every process it started with it, SIGKILL included."""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import redis

from sluice import keys
from sluice.deploy.embedded import EmbeddedRedis
from tests.conftest import ROOT, Workers, wait_for

pytestmark = pytest.mark.integration

FAST_RECOVERY = {"SLUICE_HEARTBEAT_INTERVAL": "0.2", "SLUICE_REAPER_INTERVAL": "0.5"}
ARGS = ("-c", "1", "--without-mingle", "--without-gossip")


def test_idle_worker_sent_sigterm_while_redis_is_down_exits_within_seconds(tmp_path: Path) -> None:
    """Redis is killed under an idle worker, then the worker gets SIGTERM: it and its pool
    processes are gone within 10 s (it used to wait out the outage removing its heartbeat key,
    two minutes a command), with exit code 0."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    pool = Workers(server.client(), tmp_path)
    try:
        worker = pool.start("tests.apps.basic", "cpu", "stranded", *ARGS, env={"SLUICE_BROKER_URL": server.url})
        wait_for(lambda: "stranded@test ready." in pool.log("stranded"), 30, "the worker's consumer to connect")
        family = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]
        server.process.kill()
        server.process.wait(10)
        wait_for(lambda: "Connection to broker lost" in pool.log("stranded"), 30, "the worker to lose Redis")
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker was still running 10 s after SIGTERM: {pool.log('stranded')[-3000:]}")
        _, alive = psutil.wait_procs(family, timeout=10)
        assert alive == [], f"left behind: {alive}"
        assert code == 0, pool.log("stranded")[-3000:]
    finally:
        pool.stop_all()
        server.stop()


def test_worker_sent_sigterm_mid_task_finishes_it_once_then_exits(redis_client: redis.Redis,
                                                                  tmp_path: Path) -> None:
    """Warm shutdown kept: a worker sent SIGTERM while an 8 s task runs finishes that task, and
    only it does, though a second worker sweeps for orphans every 0.5 s (the stopping worker
    keeps beating, naming the task, until the task ends); then it exits 0 and its heartbeat
    key is removed."""
    ladder = importlib.import_module("tests.apps.ladder")
    client = redis_client  # flushed: nothing another test left in the session's Redis is swept here
    pool = Workers(client, tmp_path)
    try:
        runner = pool.start("tests.apps.ladder", "small", "runner", *ARGS, env=FAST_RECOVERY)
        result = ladder.long_step.delay(8.0)
        wait_for(lambda: client.exists(f"test:running:{result.id}:1"), 60, "the task to start")
        # the sweeper serves medium too, where a retry of a task taken for lost would run
        pool.start("tests.apps.ladder", "small", "sweeper", "--queue", "medium", *ARGS, env=FAST_RECOVERY)
        stopped = time.time()
        runner.send_signal(signal.SIGTERM)
        wait_for(lambda: "Warm shutdown" in pool.log("runner"), 10, "the runner to begin its warm shutdown")
        # several heartbeat TTLs (5 x 0.2 s) and reaper sweeps into the shutdown, the runner still beats
        wait_for(lambda: pool.heartbeat("runner")["ts"] > stopped + 1.5, 10,
                 "the runner to keep beating 1.5 s into its warm shutdown")
        assert result.id in pool.heartbeat("runner")["running"]
        assert not client.exists(f"test:completed:{result.id}"), "a run ended while the runner's went on: run twice?"
        assert result.get(timeout=60) == {"queue": "small", "worker": "runner@test", "attempt": 1}
        assert client.lrange(f"test:runs:{result.id}", 0, -1) == [b"small"]   # ran once, on the runner
        assert client.get(f"test:completed:{result.id}") == b"1"
        assert runner.wait(30) == 0, pool.log("runner")[-3000:]
        assert not client.exists(keys.worker_heartbeat("runner@test"))
    finally:
        pool.stop_all()


def test_sigkilled_sluice_up_leaves_no_process_behind(tmp_path: Path) -> None:
    """`sluice up` is SIGKILLed (no handler runs): Redis, both workers with their pool processes
    and Flower are all gone within 15 s (workers and Flower used to live on as orphans)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SLUICE_BROKER_URL", "SLUICE_REMOTE_SECRET")}
    env |= {"SLUICE_HOME": str(tmp_path), "SLUICE_GPU_COUNT": "0", "PYTHONPATH": str(ROOT)}
    up = subprocess.Popen([sys.executable, "-m", "sluice", "up"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=env, cwd=tmp_path)
    family: list[psutil.Process] = []
    try:
        state = tmp_path / "up.json"
        wait_for(lambda: up.poll() is not None or state.exists(), 90, "sluice up to start its children")
        assert up.poll() is None, "sluice up exited"
        client = redis.Redis.from_url(json.loads(state.read_text())["broker_url"])
        host = socket.gethostname()
        for name in ("cpu", "highmem"):
            wait_for(lambda n=name: client.exists(keys.worker_heartbeat(f"{n}@{host}")), 60, f"the {name} worker")
        family = psutil.Process(up.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in family)
        assert "redis-server" in names and "flower" in names and names.count("sluice worker") >= 4, names
        up.kill()
        up.wait(10)
        _, alive = psutil.wait_procs(family, timeout=15)
        assert alive == [], f"left behind: {[(p.pid, p.cmdline()) for p in alive]}"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)
        for process in family:
            try:
                process.kill()
            except psutil.Error:
                pass
