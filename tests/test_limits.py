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
from sluice.queues.catalog import Catalog, ResourceClass
from tests.conftest import Workers, wait_for

LAYOUT = RedisLayout()
POOL = ResourceClass("pool", Compute(cpu="1", memory="1Gi"), slots=4)
CATALOG = Catalog([POOL])
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
    return reply[3].decode() if len(reply) > 2 else None    # {dead} or {dead, wait}: nothing taken


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
    registry.register(LimitMetrics(redis_client, CATALOG))
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


def test_a_rate_limit_spaces_takes_by_redis_clock_and_the_empty_fetch_says_when_the_next_may_start(
        redis_client: redis.Redis) -> None:
    """A rate limit of one start per 0.3 s: the first message is taken, the second waits in place
    while the free one behind it is taken; the fetch that finds only it returns how many
    microseconds until its start (at most 0.3 s); it is taken once that time has passed, not before."""
    first, second = (_publish(redis_client, [["r", 0, 0.3]]) for _ in range(2))
    free = _publish(redis_client, None)
    began = time.monotonic()
    assert [_fetch(redis_client), _fetch(redis_client)] == [first, free]
    reply = scripts.run(redis_client, "fetch", *FETCH.arguments(time.time(), False, "", 0))
    assert len(reply) == 2 and 0 < reply[1] <= 300_000, reply
    registry = CollectorRegistry()
    registry.register(LimitMetrics(redis_client, CATALOG))
    exposed = generate_latest(registry).decode()
    assert 'sluice_limit_rate{limit="r"} 3.33' in exposed and 'sluice_limit_next_start_seconds{limit="r"} 0.' in exposed
    shown = CliRunner().invoke(status)
    assert "rate limits (used in the last 10 min): r 3.33333/s, next start in 0." in shown.output, shown.output
    time.sleep(max(0.0, reply[1] / 1e6 - (time.monotonic() - began) - 0.1))
    assert _fetch(redis_client) is None                      # still 0.1 s early
    time.sleep(0.15)
    assert _fetch(redis_client) == second
    assert redis_client.llen(POOL.name) == 0 and not redis_client.hlen(keys.HELD_LIMITS)
    assert [m.decode() for m in redis_client.zrange(keys.LIMIT_RATES, 0, -1)] == ["r\t0.3"]
    assert 0 < redis_client.pttl(keys.LIMIT_NEXT_PREFIX + "r") <= 301      # gone once it passed


def test_each_key_has_its_own_rate_and_a_rate_and_a_running_limit_both_hold(redis_client: redis.Redis) -> None:
    """Keys a and b of one rate limit (one start per 0.3 s) start back to back; a's second waits
    for a's spacing. A message under a rate limit and a concurrency limit waits while either has
    no room."""
    a1, a2 = (_publish(redis_client, [["t:customer=a", 0, 0.3]]) for _ in range(2))
    b1 = _publish(redis_client, [["t:customer=b", 0, 0.3]])
    assert [_fetch(redis_client), _fetch(redis_client), _fetch(redis_client)] == [a1, b1, None]
    time.sleep(0.35)
    assert _fetch(redis_client) == a2
    both = [_publish(redis_client, [["u", 1, 0], ["u", 0, 0.3]]) for _ in range(2)]
    assert _fetch(redis_client, acks=(a1, b1, a2)) == both[0]
    time.sleep(0.35)
    assert _fetch(redis_client) is None                                    # its rate has room, running 1 of 1
    assert _fetch(redis_client, acks=(both[0],)) == both[1]


def test_a_rate_limit_starts_at_most_n_in_its_window_however_its_spacing_would_allow(
        redis_client: redis.Redis) -> None:
    """Two starts per 0.4 s window, spaced 0.05 s: the first two are taken 0.05 s apart at most,
    the third not before the window from the first has passed, when the reply said it would."""
    tags = [_publish(redis_client, [["w", 0, 0.05, 2, 0.4]]) for _ in range(3)]
    began = time.monotonic()
    taken = []
    while len(taken) < 3 and time.monotonic() - began < 5:
        reply = scripts.run(redis_client, "fetch", *FETCH.arguments(time.time(), False, "", 0))
        if len(reply) > 2:
            taken.append((reply[3].decode(), time.monotonic() - began))
        time.sleep(0.005)
    assert [tag for tag, _ in taken] == tags
    assert taken[1][1] < 0.1 and taken[2][1] >= 0.39, taken


def test_messages_waiting_for_a_rate_limit_are_parked_out_of_the_way_and_come_back_in_order(
        redis_client: redis.Redis) -> None:
    """100 messages under one start per 0.3 s, then an unlimited one: the first is taken, the
    next fetches park the other 99 (at most 64 a fetch) and reach the unlimited one, which no
    longer waits behind them. Parked messages still count as waiting (kombu's queue size, the
    depth sluice status shows); once the next start comes they come back one at a time, oldest
    first, each on its limit's time; kombu's size and purge count and empty them."""
    limited = [_publish(redis_client, [["r", 0, 0.3]]) for _ in range(100)]
    free = _publish(redis_client, None)
    began = time.monotonic()
    assert _fetch(redis_client) == limited[0]
    assert _fetch(redis_client) is None                           # parked 64
    assert redis_client.llen(keys.parked_count(POOL.name)) == 64
    assert _fetch(redis_client) == free                           # parked 35 more, then took it
    assert redis_client.llen(POOL.name) == 0 and redis_client.llen(keys.parked_count(POOL.name)) == 99
    assert LAYOUT.queue_depth(redis_client, POOL.name) == 99
    registry = CollectorRegistry()
    registry.register(LimitMetrics(redis_client, CATALOG))
    assert 'sluice_limit_waiting{limit="r"} 99.0' in generate_latest(registry).decode()
    assert {m["properties"]["delivery_tag"] for m in LAYOUT.waiting(redis_client, POOL.name)} == set(limited[1:])
    assert time.monotonic() - began < 0.25
    assert _fetch(redis_client) is None
    taken = []
    deadline = time.monotonic() + 5
    while len(taken) < 3 and time.monotonic() < deadline:
        tag = _fetch(redis_client)
        if tag:
            taken.append((tag, time.monotonic()))
        time.sleep(0.01)
    assert [tag for tag, _ in taken] == limited[1:4]
    assert all(later - earlier >= 0.29 for (_, earlier), (_, later) in zip(taken, taken[1:]))
    assert redis_client.llen(keys.parked_count(POOL.name)) == 96
    with App("tests.limits.view").connection_for_write() as connection:
        channel = connection.default_channel
        assert channel._size(POOL.name) == 96                      # what celery inspect and purge see
        assert channel._purge(POOL.name) == 96
        assert channel._size(POOL.name) == 0
    assert not redis_client.keys(keys.parked(POOL.name) + "*") and not redis_client.llen(keys.parked_count(POOL.name))


def test_a_parked_entry_that_names_no_line_gives_its_message_back_to_the_queue_not_lost(
        redis_client: redis.Redis) -> None:
    """Only the fetch script writes the parked index, but one bad entry must not lose a message:
    a due entry that names no line puts its message at the head of the queue's own line."""
    tag = _publish(redis_client, None)
    raw = redis_client.rpop(POOL.name)
    index = keys.parked(POOL.name)
    redis_client.zadd(index, {"not-a-parked-line": 0})
    redis_client.lpush(f"{index}\tnot-a-parked-line", raw)
    redis_client.lpush(keys.parked_count(POOL.name), "1")
    assert _fetch(redis_client) == tag
    assert not redis_client.zcard(index) and not redis_client.llen(keys.parked_count(POOL.name))


def test_a_message_with_no_limits_and_no_charge_is_held_to_its_tasks_limits_from_the_catalog(
        redis_client: redis.Redis) -> None:
    """What a plain Celery producer sends carries neither sluice's limits nor its charge: the
    fetch holds it to the task-wide limits workers publish with the task catalog (a keyed limit
    under the task's own id); a message a sluice producer stamped (a charge, no limits: the task
    had none when sent) is not."""
    from sluice.queues import task_catalog
    from sluice.queues.broker.fetching import FetchCall

    limits = importlib.import_module("tests.apps.limits")
    task_catalog.publish(redis_client, task_catalog.entries_of(limits.app, "w@test"))
    wide = json.loads(redis_client.hget(keys.TASK_LIMITS, limits.per_customer.name))
    assert wide == [[limits.per_customer.name, 1, 0]] and json.loads(redis_client.hget(keys.TASK_LIMITS, limits.ping.name)) == []
    assert redis_client.hget(keys.TASK_LIMITS, limits.metered_per_customer.name) == json.dumps(
        [[limits.metered_per_customer.name, 0, 0.26, 4, 1.04]]).encode()

    def publish(queue: str, headers: dict[str, Any]) -> str:
        tag = _publish(redis_client, None)
        raw = json.loads(redis_client.lpop(POOL.name))  # the one just sent: re-sent with these headers, to queue
        raw["headers"] = headers
        redis_client.lpush(queue, json.dumps(raw))
        return tag

    plain = {"task": limits.per_customer.name, "id": "x"}
    first, second = publish(POOL.name, plain), publish(POOL.name, plain)
    stamped = publish(POOL.name, {**plain, "sluice_charge": "1000 1073741824 0"})
    assert [_fetch(redis_client), _fetch(redis_client), _fetch(redis_client)] == [first, stamped, None]
    assert _running(redis_client) == {limits.per_customer.name: 1}
    intake = FetchCall.of(LAYOUT, [("celery", False, None)])       # the intake only forwards: no limits there
    in_intake = [publish("celery", plain) for _ in range(2)]
    taken = [scripts.run(redis_client, "fetch", *intake.arguments(time.time(), False, "", 0))[3].decode()
             for _ in range(2)]
    assert taken == in_intake
    assert _fetch(redis_client, acks=(first,)) == second


def test_a_plain_celery_producers_calls_keep_to_the_tasks_concurrency_limit(
        workers: Workers, redis_server: EmbeddedRedis, redis_client: redis.Redis) -> None:
    """Six calls of scarce (max_running=2) sent by stock Celery, which stamps no limits: one worker
    of 4 processes never holds more than 2 of them (sampled every 10 ms), and all six end."""
    from celery import Celery

    limits = importlib.import_module("tests.apps.limits")
    workers.start("tests.apps.limits", "cpu", "plain", "-c", "4", "--without-mingle", "--without-gossip")
    stock = Celery("tests.limits.stock", broker=redis_server.url, backend=redis_server.url)
    naps = [stock.send_task(limits.scarce.name, args=(f"p{i}", 0.4), queue="cpu") for i in range(6)]
    most, deadline = 0, time.monotonic() + 60
    while not all(nap.ready() for nap in naps) and time.monotonic() < deadline:
        most = max(most, _running(redis_client).get(limits.scarce.name, 0))
        time.sleep(0.01)
    assert [nap.get(timeout=10) for nap in naps] == [f"p{i}" for i in range(6)]
    assert most == 2


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
    assert limits_header(task.name, task.cluster_limits, task.run, ("acme", 1), {}) == [
        [f"{task.name}:customer=acme", 1, 0]]
    assert limits_header(limits.scarce.name, {"max_running": 2}, limits.scarce.run, ("x", 0), {}) == [
        [limits.scarce.name, 2, 0]]
    metered = limits.metered_per_customer
    assert limits_header(metered.name, metered.cluster_limits, metered.run, (), {"customer": "acme", "n": 1}) == [
        [f"{metered.name}:customer=acme", 0, 0.26, 4, 1.04]]   # 4 per 1.04 s: 0.04 s for start jitter


def test_rate_limit_per_worker_leaves_a_plain_rate_to_celery_and_keeps_a_keyed_one_in_the_cluster(
        redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    """By default a rate_limit string is held by the cluster (stamped on each call, no Celery
    bucket on the worker); with rate_limit_per_worker it is Celery's again (not stamped, a
    per-worker bucket), while a keyed Limit, which Celery cannot hold, stays the cluster's."""
    from celery.utils.time import rate

    from sluice.workers.consumer import SluiceConsumer

    def declared(name: str) -> tuple[Any, Any]:
        app = App(name)

        @app.task(rate_limit="20/s")
        def plain(n: int) -> None: ...

        @app.task(rate_limit=Limit("5/s", key="customer"))
        def keyed(customer: str) -> None: ...

        return plain, keyed

    bucket = SluiceConsumer.bucket_for_task.__get__(object.__new__(SluiceConsumer))
    plain, keyed = declared("tests.limits.cluster")
    assert plain.cluster_limits == {"rate_limit": "20/s"} and bucket(plain) is None
    monkeypatch.setenv("SLUICE_RATE_LIMIT_PER_WORKER", "1")
    plain, keyed = declared("tests.limits.per_worker")
    assert plain.cluster_limits == {} and bucket(plain).fill_rate == rate("20/s")
    assert keyed.cluster_limits == {"rate_limit": Limit("5/s", key="customer")} and bucket(keyed) is None


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


@pytest.mark.parametrize(("option", "match"), [
    ("fast", r"rate_limit='fast' must be a positive rate: \"50/s\", \"10/m\""),
    ("10/d", r"rate_limit='10/d' must be a positive rate"),
    ("0/s", r"rate_limit='0/s' must be a positive rate"),
    (-5, r"rate_limit=-5 must be a positive rate"),
    (Limit("10/s", key="customer"), r"Limit\(key='customer'\) names no argument"),
    (Limit(running=2), "is a limit of the other kind"),
])
def test_a_bad_rate_limit_is_refused_at_decoration(redis_server: EmbeddedRedis, option: Any, match: str) -> None:
    """Malformed, zero and negative rates, a key naming no argument, and a concurrency Limit given
    as a rate: each a ConfigurationError at @app.task naming the value, before any call."""
    app = App("tests.limits.bad_rate")
    with pytest.raises(ConfigurationError, match=match):
        @app.task(rate_limit=option)
        def charge(order_id: str) -> None: ...


def test_explain_shows_each_tasks_limits(redis_server: EmbeddedRedis) -> None:
    from sluice.cli.status import explain

    shown = CliRunner().invoke(explain, ["-A", "tests.apps.limits"], terminal_width=250)
    assert shown.exit_code == 0, shown.output
    rows = {line.split("│")[1].strip(): line.split("│")[5].strip() for line in shown.output.splitlines()
            if line.startswith("│")}
    assert rows["tests.apps.limits.metered"] == "20/s"
    assert rows["tests.apps.limits.metered_per_customer"] == "4/s per customer"
    assert rows["tests.apps.limits.scarce"] == "2 running"
    assert rows["tests.apps.limits.per_customer"] == "1 running per customer"
    assert rows["tests.apps.limits.ping"] == "-"


def test_a_limit_needs_exactly_one_of_rate_and_running() -> None:
    with pytest.raises(ConfigurationError, match=r"needs exactly one of them"):
        Limit()
    with pytest.raises(ConfigurationError, match=r"needs exactly one of them"):
        Limit("5/s", running=2)
    with pytest.raises(ConfigurationError, match=r"Limit\(rate\)='5/q' must be a positive rate"):
        Limit("5/q")
