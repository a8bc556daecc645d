"""``task.delay_many``: every call published once, routed like ``.delay()``, each message the one
``apply_async`` builds; results as they finish; a stop midway says exactly what went out.
Real redis-server, real workers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis

from sluice import App
from sluice.deploy.embedded import EmbeddedRedis
from sluice.errors import ConfigurationError, SubmitInterrupted
from sluice.tasks.bulk import BulkResult
from tests.conftest import Workers

pytestmark = pytest.mark.integration
FAST = ("--without-mingle", "--without-gossip")


def _queued(client: redis.Redis, queue: str) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


def test_delay_many_runs_every_call_once_and_yields_each_as_it_finishes(basic_app: ModuleType,
                                                                        workers: Workers) -> None:
    """2,500 calls in chunks of 1,000 (three pipelines): every call runs once with its own
    argument, as_completed yields each index exactly once with its value, and get() returns
    them in submission order."""
    workers.start("tests.apps.basic", "cpu", "cpu1", *FAST)
    bulk = basic_app.double.delay_many(range(2500), progress=False)
    assert isinstance(bulk, BulkResult) and len(bulk) == 2500 and len({r.id for r in bulk.results}) == 2500
    seen = dict(bulk.as_completed(timeout=90, progress=False))
    assert seen == {i: 2 * i for i in range(2500)}
    assert bulk.get(timeout=30) == [2 * i for i in range(2500)]


def test_a_bulk_message_is_the_one_apply_async_builds_routed_the_same(basic_app: ModuleType,
                                                                      redis_client: redis.Redis) -> None:
    """No worker: the messages stay queued where routing put them (big_task's 4Gi on highmem),
    and one from delay_many is, field for field, the one apply_async makes with the same
    arguments (also with a quote and a non-ASCII letter in them, for double on cpu) but for its
    own id and delivery tag, each made fresh per message; each rings the queue's bell once."""
    basic_app.big_task.apply_async()
    basic_app.big_task.delay_many([()] * 3, progress=False)
    assert redis_client.llen("cpu") == 0
    messages = _queued(redis_client, "highmem")
    assert len(messages) == 4 and redis_client.llen("sluice:bell:highmem") == 4
    args = ('say "hi", naïve',)   # a quote and a non-ASCII letter: escaped in the header as kombu does
    basic_app.double.apply_async(args)
    basic_app.double.delay_many([args] * 3, progress=False)
    messages += _queued(redis_client, "cpu")
    ids = [m["headers"]["id"] for m in messages]
    tags = [m["properties"]["delivery_tag"] for m in messages]
    assert len(set(ids)) == len(set(tags)) == 8

    def comparable(message: dict) -> dict:
        headers, properties = message["headers"], message["properties"]
        assert headers["id"] == headers["root_id"] == properties["correlation_id"]
        return {**message, "headers": {k: v for k, v in headers.items() if k not in ("id", "root_id")},
                "properties": {k: v for k, v in properties.items() if k not in ("correlation_id", "delivery_tag")}}

    for queued in (messages[:4], messages[4:]):
        single, *bulk = [comparable(m) for m in reversed(queued)]
        assert all(m == single for m in bulk), (single, bulk[0])
    assert single["headers"]["argsrepr"] == repr(args)


def test_as_completed_raises_a_failed_call_or_yields_its_exception(basic_app: ModuleType, workers: Workers) -> None:
    workers.start("tests.apps.basic", "cpu", "cpu1", *FAST)
    bulk = basic_app.double.delay_many([1, -2, 3], progress=False)
    outcomes = dict(bulk.as_completed(timeout=60, propagate=False, progress=False))
    assert outcomes[0] == 2 and outcomes[2] == 6
    assert isinstance(outcomes[1], ValueError) and "negative: -2" in str(outcomes[1])
    with pytest.raises(ValueError, match="negative: -2"):
        list(basic_app.double.delay_many([-2], progress=False).as_completed(timeout=60, progress=False))


def test_an_argument_that_cannot_travel_stops_it_after_the_chunks_already_out(basic_app: ModuleType,
                                                                              redis_client: redis.Redis) -> None:
    """The 5th call's argument is not JSON: chunks 1 and 2 (two calls each) went out, chunk 3
    is dropped whole, and SubmitInterrupted holds exactly the four published calls."""
    items = [1, 2, 3, 4, object(), 6]
    with pytest.raises(SubmitInterrupted, match="stopped after 4 published calls") as stopped:
        basic_app.double.delay_many(items, chunk=2, progress=False)
    published = stopped.value.published
    assert [r.id for r in published.results] == [m["headers"]["id"] for m in reversed(_queued(redis_client, "cpu"))]
    assert len(published) == 4 and len(stopped.value.uncertain) == 0


def test_chunk_must_be_a_positive_int(basic_app: ModuleType) -> None:
    with pytest.raises(ConfigurationError, match=r"chunk=0: the calls per pipeline must be a positive int"):
        basic_app.double.delay_many([1], chunk=0)


def test_with_a_publish_signal_receiver_each_call_goes_through_apply_async(basic_app: ModuleType,
                                                                          redis_client: redis.Redis) -> None:
    """A ``before_task_publish`` receiver must see every message, so delay_many falls back to
    ``apply_async`` per call: the receiver sees each id, and each message is queued once."""
    from celery import signals

    seen: list[str] = []

    def receiver(headers: dict | None = None, **_: object) -> None:
        seen.append((headers or {})["id"])

    signals.before_task_publish.connect(receiver)
    try:
        bulk = basic_app.double.delay_many(range(5), progress=False)
    finally:
        signals.before_task_publish.disconnect(receiver)
    assert seen == [r.id for r in bulk.results]
    assert sorted(m["headers"]["id"] for m in _queued(redis_client, "cpu")) == sorted(seen)


def test_redis_gone_between_chunks_says_what_went_out_and_nothing_is_lost_or_doubled(tmp_path: Path) -> None:
    """Redis stops while the second chunk is being built (the items are a generator that stops
    it): the first chunk is out, the second cannot be; SubmitInterrupted holds the two published
    calls and names the two in flight as uncertain. After Redis restarts (its AOF), the queue
    holds exactly the published calls, once each."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        app = App("tests.bulk_fault", broker=server.url)
        task = app.task(name="tests.bulk_fault.echo")(_echo)

        def items() -> Iterator[int]:
            yield from (1, 2, 3)
            server.stop()          # mid-chunk 2: its flush finds no Redis
            yield 4

        stopped_after = r"stopped after 2 published calls \(2 more may have been\)"
        with pytest.raises(SubmitInterrupted, match=stopped_after) as stopped:
            task.delay_many(items(), chunk=2, progress=False)
        published = [r.id for r in stopped.value.published.results]
        assert len(published) == 2 and len(stopped.value.uncertain) == 2
        server.start()
        assert sorted(m["headers"]["id"] for m in _queued(server.client(), "cpu")) == sorted(published)
    finally:
        server.stop()


def _echo(x: int) -> int:
    """The task body of the fault test (no worker runs it)."""
    return x
