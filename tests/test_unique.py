"""Unique tasks and idempotency keys, on a real redis-server (and a real worker where a body
must run): a second call with a held key publishes nothing and returns the first call's result,
atomically under 200 concurrent callers on 8 threads; a plain Celery producer's duplicates are
claimed on the worker, not run, and resolve to the first call's result; a failed publish gives its key back; the
worker keeps the claim ttl past the end; bad keys and declarations are named errors."""

from __future__ import annotations

import importlib
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType

import pytest
import redis

from sluice import App, ConfigurationError, Unique, keys
from sluice.deploy.embedded import EmbeddedRedis
from sluice.queues.broker.layout import RedisLayout
from tests.conftest import Workers

WORKER = ("-c", "2", "--without-mingle", "--without-gossip")


@pytest.fixture
def limits(redis_server: EmbeddedRedis) -> ModuleType:
    return importlib.import_module("tests.apps.limits")


def test_a_second_call_with_the_same_key_publishes_nothing_and_returns_the_first_calls_result(
        limits: ModuleType, redis_client: redis.Redis) -> None:
    first = limits.ping.apply_async(("a",), idempotency_key="order-42")
    again = limits.ping.apply_async(("b",), idempotency_key="order-42")
    other = limits.ping.apply_async(("c",), idempotency_key="order-43")
    assert again.id == first.id != other.id
    assert RedisLayout().queue_depth(redis_client, "cpu") == 2
    by_argument = [limits.order.delay("o-1"), limits.order.delay("o-1", amount=5), limits.order.delay(order_id="o-1")]
    assert len({call.id for call in by_argument}) == 1
    assert limits.order.delay("o-2").id != by_argument[0].id
    assert RedisLayout().queue_depth(redis_client, "cpu") == 4
    bulk = limits.order.delay_many(["o-5", "o-5", "o-1"], progress=False).ids    # each item claims its key
    assert bulk[0] == bulk[1] != bulk[2] == by_argument[0].id
    assert RedisLayout().queue_depth(redis_client, "cpu") == 5


def test_two_hundred_concurrent_calls_with_one_key_make_one_task_and_one_run(
        limits: ModuleType, workers: Workers, redis_client: redis.Redis) -> None:
    workers.start("tests.apps.limits", "cpu", "unique", *WORKER)
    with ThreadPoolExecutor(8) as pool:
        calls = list(pool.map(lambda n: limits.ping.apply_async((f"call-{n}",), idempotency_key="once"), range(200)))
    assert len({call.id for call in calls}) == 1
    value = calls[0].get(timeout=60)
    assert limits.ping.delay("after").get(timeout=60) == "after"   # the queue drained behind it
    assert redis_client.lrange(limits.RUNS, 0, -1) == [value.encode(), b"after"]


def test_a_plain_celery_producers_duplicates_are_not_run_and_resolve_to_the_first_calls_result(
        limits: ModuleType, workers: Workers, redis_server: EmbeddedRedis, redis_client: redis.Redis) -> None:
    """Stock Celery makes no claim at publish. Three calls of order (declared unique by
    order_id) and three of ping sent with the ``sluice_unique`` header, all with one key each:
    the worker claims the key, runs one of each (whichever of its processes claimed first),
    acknowledges the others without running them, and every one of the six ids resolves to the
    result of the one that ran."""
    from celery import Celery

    stock = Celery("tests.unique.stock", broker=redis_server.url, backend=redis_server.url)
    orders = [stock.send_task(limits.order.name, args=("o-7",), queue="cpu") for _ in range(3)]
    pings = [stock.send_task(limits.ping.name, args=(f"p{n}",), queue="cpu", headers={"sluice_unique": "60 k-1"})
             for n in range(3)]
    workers.start("tests.apps.limits", "cpu", "plain-unique", *WORKER)
    assert [call.get(timeout=60) for call in orders] == ["o-7"] * 3
    ran = {call.get(timeout=60) for call in pings}
    assert len(ran) == 1 and ran <= {"p0", "p1", "p2"}
    assert sorted(redis_client.lrange(limits.RUNS, 0, -1)) == [b"o-7", ran.pop().encode()]


def test_a_publish_that_fails_gives_its_key_back(limits: ModuleType, redis_client: redis.Redis) -> None:
    with pytest.raises(Exception, match="not JSON serializable"):
        limits.ping.apply_async((object(),), idempotency_key="flaky")
    assert redis_client.get(keys.unique(limits.ping.name, "flaky")) is None
    assert limits.ping.apply_async(("ok",), idempotency_key="flaky").id is not None


def test_the_worker_keeps_the_claim_ttl_past_the_tasks_end(
        limits: ModuleType, workers: Workers, redis_client: redis.Redis) -> None:
    call = limits.order.delay("o-9")
    redis_client.expire(keys.unique(limits.order.name, "o-9"), 30)    # as if the task waited 30 of its 60 s
    workers.start("tests.apps.limits", "cpu", "renewing", *WORKER)
    assert call.get(timeout=60) == "o-9"
    assert redis_client.ttl(keys.unique(limits.order.name, "o-9")) > 50
    assert limits.order.delay("o-9").id == call.id                  # finished, within ttl: still the same


@pytest.mark.parametrize("key", [42, "", "k" * 257])
def test_a_bad_idempotency_key_is_refused_at_the_call(limits: ModuleType, key: object) -> None:
    with pytest.raises(ConfigurationError, match=r"idempotency key .* must be a non-empty string"):
        limits.ping.apply_async(("x",), idempotency_key=key)


def test_an_empty_key_argument_of_a_unique_task_is_refused_at_the_call(limits: ModuleType) -> None:
    with pytest.raises(ConfigurationError, match=r"idempotency key '' must be a non-empty string"):
        limits.order.delay("")


def test_a_bad_unique_declaration_is_refused_at_decoration(redis_server: EmbeddedRedis) -> None:
    app = App("tests.unique.bad")
    with pytest.raises(ConfigurationError, match=r"Unique\(key='customer'\) names no argument .*: order_id"):
        @app.task(unique=Unique(key="customer"))
        def charge(order_id: str) -> None: ...
    with pytest.raises(ConfigurationError, match="ttl=0"):
        Unique(key="order_id", ttl=0)
    with pytest.raises(ConfigurationError, match="must be a sluice.Unique"):
        @app.task(unique="order_id")
        def refund(order_id: str) -> None: ...
