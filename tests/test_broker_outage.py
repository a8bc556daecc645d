"""Redis dies (kill -9, AOF on) and comes back while `.delay()` tasks run: workers, the result
backend and sluice's own writes wait the outage out, so no task whose body completed is
reported failed, and every task reaches SUCCESS."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sluice import App, Compute, ResourceClass
from sluice.deploy.embedded import EmbeddedRedis
from tests.conftest import Workers, wait_for

pytestmark = pytest.mark.integration

TASKS = 16
LADDER = [ResourceClass("small", Compute(cpu="1", memory="150Mi"), slots=2),
          ResourceClass("medium", Compute(cpu="1", memory="300Mi"), slots=2),
          ResourceClass("large", Compute(cpu="1", memory="600Mi"), slots=2)]


def test_redis_killed_and_restarted_while_tasks_run_fails_none(redis_server: EmbeddedRedis, tmp_path: Path) -> None:
    """Sixteen 1.5 s tasks on a 2-slot worker; Redis is SIGKILLed while two of them run and
    restarted 3 s later on the same port. Every task ends SUCCESS, and every body completed."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    client = server.client()
    env = {"SLUICE_BROKER_URL": server.url, "SLUICE_HEARTBEAT_INTERVAL": "0.5", "SLUICE_REAPER_INTERVAL": "1"}
    pool = Workers(client, tmp_path)
    try:
        pool.start("tests.apps.ladder", "small", "outlasting", "-c", "2", "--without-mingle", "--without-gossip",
                   env=env)
        sender = App("tests.outage.sender", broker=server.url, classes=LADDER,
                     default_compute=Compute(cpu="1", memory="100Mi"))
        results = [sender.send_task("tests.apps.ladder.long_step", args=(1.5,)) for _ in range(TASKS)]
        wait_for(lambda: len(client.keys("test:running:*")) >= 3, 60, "the second pair of tasks to start")
        server.process.kill()
        server.process.wait(10)
        time.sleep(3)
        server.start()
        states = [result.get(timeout=90, propagate=False) and result.state for result in results]
        assert states == ["SUCCESS"] * TASKS, [r.info for r in results if r.state != "SUCCESS"]
        completed = [int(client.get(f"test:completed:{r.id}") or 0) for r in results]
        assert all(n >= 1 for n in completed), completed   # a body writes its mark once it ran to the end
    finally:
        pool.stop_all()
        server.stop()
