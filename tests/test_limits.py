"""Concurrency limits across the cluster: the fetch script by hand on a real Redis (a full limit
holds its message in place and the fetch takes the one behind it; a key has its own count;
counts follow the held messages back to zero), then real workers SIGKILLed under a limit of 2,
which sampled from the held messages is never exceeded; bad declarations are named errors."""

from __future__ import annotations

import importlib
import json
import os
import signal
import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from prometheus_client import generate_latest
from prometheus_client.core import CollectorRegistry

from sluice import App, ConfigurationError, Limit, keys
from sluice.cli.status import status
from sluice.compute import Compute
from sluice.deploy.embedded import EmbeddedRedis
from sluice.deploy.metrics import LimitMetrics
from sluice.headers import LIMITS
from sluice.queues.broker import scripts
from sluice.queues.broker.fetching import FetchCall
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.catalog import ResourceClass
from tests.conftest import Workers, wait_for

LAYOUT = RedisLayout()
POOL = ResourceClass("pool", Compute(cpu="1", memory="1Gi"), slots=4)
FETCH = FetchCall.of(LAYOUT, [(POOL.name, False, POOL.fetch_terms())])
_sent = 0


def _publish(client: redis.Redis, limits: list[list[Any]] | None) -> str:
    global _sent
    _sent += 1
    tag = f"m{_sent}"
    headers = {LIMITS: limits} if limits else {}
    client.lpush(POOL.name, json.dumps({"body": "", "headers": headers, "properties": {
        "delivery_tag": tag, "delivery_info": {"exchange": "", "routing_key": POOL.name}}}))
    return tag


def _fetch(client: redis.Redis, acks: tuple[str, ...] = ()) -> str | None:
    reply = scripts.run(client, "fetch", *FETCH.arguments(time.time(), False, "", 0, acks))
    return reply[3].decode() if len(reply) > 1 else None


def _running(client: redis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(keys.LIMIT_RUNNING).items()}


def test_a_full_limit_keeps_its_message_in_place_and_the_fetch_takes_the_one_behind(redis_client: redis.Redis) -> None:
    limited = [_publish(redis_client, [["t", 2]]) for _ in range(3)]
    free = _publish(redis_client, None)
    assert [_fetch(redis_client) for _ in range(2)] == limited[:2]
    assert _fetch(redis_client) == free                       # t's third waits, in its place
    assert _fetch(redis_client) is None
    assert redis_client.llen(POOL.name) == 1 and _running(redis_client) == {"t": 2}
    registry = CollectorRegistry()
    registry.register(LimitMetrics(redis_client))
    assert 'sluice_limit_running{limit="t"} 2.0' in generate_latest(registry).decode()
    shown = CliRunner().invoke(status)
    assert shown.exit_code == 0 and "running under concurrency limits: t 2" in shown.output, shown.output
    assert _fetch(redis_client, acks=(limited[0],)) == limited[2]
    _fetch(redis_client, acks=(limited[1], limited[2], free))
    assert _running(redis_client) == {} and not redis_client.hlen(keys.HELD_LIMITS)


def test_each_key_has_its_own_count(redis_client: redis.Redis) -> None:
    a1, a2 = (_publish(redis_client, [["t:customer=a", 1]]) for _ in range(2))
    b1 = _publish(redis_client, [["t:customer=b", 1]])
    assert [_fetch(redis_client), _fetch(redis_client), _fetch(redis_client)] == [a1, b1, None]
    assert _fetch(redis_client, acks=(a1,)) == a2


def test_a_limit_of_two_is_never_exceeded_while_workers_are_sigkilled_and_every_task_ends(
        workers: Workers, redis_server: EmbeddedRedis, redis_client: redis.Redis) -> None:
    """Two workers of 2 processes, 12 naps of 0.4 s under max_running=2; one worker is SIGKILLed
    while it runs one and a new one started. Sampled every 10 ms from Redis, never more than 2
    held; every nap ends (SUCCESS, or WorkerLost for what the killed worker ran: the task has no
    retry policy); no count is left."""
    limits = importlib.import_module("tests.apps.limits")
    fast = {"SLUICE_HEARTBEAT_INTERVAL": "0.2", "SLUICE_REAPER_INTERVAL": "0.5", "SLUICE_ORPHAN_GRACE": "4"}
    args = ("-c", "2", "--without-mingle", "--without-gossip")
    first = workers.start("tests.apps.limits", "cpu", "first", *args, env=fast)
    workers.start("tests.apps.limits", "cpu", "second", *args, env=fast)
    naps = [limits.scarce.delay(f"n{i}", 0.4) for i in range(12)]
    most, killed = 0, False
    deadline = time.monotonic() + 90
    while not all(nap.ready() for nap in naps) and time.monotonic() < deadline:
        held = _running(redis_client).get(limits.scarce.name, 0)
        most = max(most, held, redis_client.hlen(keys.HELD_LIMITS))
        if not killed and redis_client.llen(limits.RUNS) >= 3:
            os.killpg(first.pid, signal.SIGKILL)
            workers.start("tests.apps.limits", "cpu", "third", *args, env=fast, wait=False)
            killed = True
        time.sleep(0.01)
    assert killed
    for nap in naps:
        nap.get(timeout=30, propagate=False)
    lost = [nap for nap in naps if nap.state != "SUCCESS"]
    # the killed worker held at most its 2: without a retry policy they end as WorkerLost failures
    assert len(lost) <= 2 and all(type(nap.result).__name__ == "WorkerLost" for nap in lost), [n.result for n in lost]
    assert most == 2
    wait_for(lambda: not redis_client.hlen(keys.HELD_LIMITS), 30, "every limit count to be released")
    assert _running(redis_client) == {}


def test_a_limit_per_key_stamps_each_calls_own_id(redis_server: EmbeddedRedis) -> None:
    limits = importlib.import_module("tests.apps.limits")
    from sluice.tasks.limits import limits_header

    task = limits.per_customer
    assert limits_header(task.name, task.max_running, task.run, ("acme", 1), {}) == [[f"{task.name}:customer=acme", 1]]
    assert limits_header(limits.scarce.name, 2, limits.scarce.run, ("x", 0), {}) == [[limits.scarce.name, 2]]


@pytest.mark.parametrize(("option", "match"), [
    (0, "max_running=0 must be a whole number from 1"),
    ("2", "must be a whole number or a sluice.Limit"),
    (Limit(running=1, key="customer"), r"Limit\(key='customer'\) names no argument"),
])
def test_a_bad_max_running_is_refused_at_decoration(redis_server: EmbeddedRedis, option: Any, match: str) -> None:
    app = App("tests.limits.bad")
    with pytest.raises(ConfigurationError, match=match):
        @app.task(max_running=option)
        def charge(order_id: str) -> None: ...
    with pytest.raises(ConfigurationError, match=r"Limit\(running\)=-1"):
        Limit(running=-1)
