"""Redis dies (kill -9, AOF on) and comes back while `.delay()` tasks run: workers, the result
backend and sluice's own writes wait the outage out, so no task whose body completed is
reported failed, and every task reaches SUCCESS."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from sluice import App, Compute, ResourceClass
from sluice.deploy.embedded import EmbeddedRedis
from sluice.queues.broker.layout import RedisLayout
from tests.conftest import Workers, consuming_channel, fetch_by_hand, wait_for

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


def test_a_channel_holding_messages_closes_without_a_crash_when_redis_dies_mid_fetch(
        redis_server: EmbeddedRedis, tmp_path: Path) -> None:
    """What a worker's consumer does when its broker dies (Celery's
    ``on_connection_error_after_connected``): collect the connection (its channel's close cut
    short by the dead socket of a fetch in flight, then its transport released), then close it,
    ignoring connection errors. A sluice channel holding fetched messages and an acknowledgement
    raises nothing else on the way, so the worker reconnects instead of dying with
    "Unrecoverable error: AttributeError" (seen when a Sentinel master was killed). The held
    messages stay in Redis's unacked hash for the reaper."""
    from kombu.common import ignore_errors

    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        # every write on disk before its reply: what this test reads after the restart is what the
        # channel left, not what Redis's default once-a-second fsync had time to keep
        server.client().config_set("appendfsync", "always")
        app = App("tests.outage.closing", broker=server.url)
        queue = "closing-test"
        connection = app.connection_for_write()
        channel = consuming_channel(connection, queue, 2)
        tags = [fetch_by_hand(channel, queue) for _ in range(2)]
        channel.qos.ack(tags[0])   # pending: the next fetch carries it
        os.kill(server.process.pid, signal.SIGSTOP)   # the fetch below is never answered
        connection.transport.cycle._register_BRPOP(channel)   # the fetch, as a worker's poll sends it
        server.process.kill()
        server.process.wait(10)
        connection.maybe_close_channel(channel)   # cut short: the fetch's reply never comes
        assert not channel.closed
        connection._do_close_transport()   # as Celery's collect ends, before it closes the connection
        ignore_errors(connection, connection.close)   # raised AttributeError: the worker died
        server.start()
        held = server.client().hkeys(RedisLayout().unacked_key)
        assert sorted(held) == sorted(tag.encode() for tag in tags), "a held message left the unacked hash"
    finally:
        server.stop()


def test_a_publish_whose_connection_drops_again_after_kombu_reconnected_is_retried_not_raised(
        redis_server: EmbeddedRedis, redis_client: object) -> None:
    """Redis coming back from a restart can drop a publish more than once (a pooled connection
    from before the kill, an AOF still loading): here a proxy cuts the connection of the first
    three requests that push a message. kombu's publish retry used to give up at the second
    drop, once its reconnect had succeeded (the transport did not say which errors are
    recoverable); the task now lands, once, within the publish retry policy."""
    from tests.fault_proxy import CuttingProxy

    proxy = CuttingProxy(("127.0.0.1", redis_server.port), b"LPUSH", cuts=3)
    try:
        through_proxy = redis_server.url.replace(f":{redis_server.port}/", f":{proxy.port}/")
        sender = App("tests.outage.cut", broker=through_proxy, classes=LADDER,
                     default_compute=Compute(cpu="1", memory="100Mi"))
        result = sender.send_task("tests.apps.ladder.long_step", args=(0.1,))
        assert proxy.cut == 3
        waiting = [m for m in redis_client.lrange("small", 0, -1) if result.id.encode() in m]  # type: ignore[attr-defined]
        assert len(waiting) == 1
    finally:
        proxy.close()
