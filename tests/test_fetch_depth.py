"""The fetch script reading a queue deep and the forward script putting a message back just as
deep (what a packed worker's backfill does, ``sluice.workers.packing``), on a real Redis: the
queue keeps its order, the message taken is recorded as held, and a malformed one that deep
becomes a dead letter like any other."""

from __future__ import annotations

import json
import time

import redis

from sluice.queues.broker import scripts
from sluice.queues.broker.fetching import FetchCall
from sluice.queues.broker.layout import RedisLayout

QUEUE = "work"
LAYOUT = RedisLayout()
FETCH = FetchCall.of(LAYOUT, [(QUEUE, False, None)])


def _message(tag: str) -> str:
    return json.dumps({"body": tag, "headers": {}, "properties": {
        "delivery_tag": tag, "delivery_info": {"exchange": "", "routing_key": QUEUE}}})


def _queue(client: redis.Redis) -> list[str]:
    """The queue's tags, head (taken next) first."""
    return [json.loads(raw)["properties"]["delivery_tag"] for raw in reversed(client.lrange(QUEUE, 0, -1))]


def _fetch(client: redis.Redis, depth: int) -> str | None:
    reply = scripts.run(client, "fetch", *FETCH.arguments(time.time(), False, QUEUE, depth))
    return reply[3].decode() if len(reply) > 1 else None


def _put_back(client: redis.Redis, tag: str, depth: int) -> int:
    keys = LAYOUT.unhold_keys()
    return scripts.run(client, "forward", [*keys[:2], QUEUE, LAYOUT.bell(QUEUE), "forwarded", *keys[2:], "tenants"],
                       [tag, _message(tag), 1000, "", depth, ""])


def test_a_fetch_d_deep_takes_that_message_holds_it_and_leaves_the_rest_in_order(redis_client: redis.Redis) -> None:
    redis_client.lpush(QUEUE, *(_message(t) for t in "abcde"))     # published a first: a is the head
    assert _fetch(redis_client, 2) == "c"
    assert _queue(redis_client) == ["a", "b", "d", "e"]
    assert redis_client.hexists("unacked", "c") and redis_client.zscore("unacked_index", "c") is not None
    assert _fetch(redis_client, 4) is None                          # nothing that deep: nothing taken
    assert _queue(redis_client) == ["a", "b", "d", "e"]


def test_a_message_put_back_d_deep_is_where_it_was_and_no_longer_held(redis_client: redis.Redis) -> None:
    redis_client.lpush(QUEUE, *(_message(t) for t in "abcde"))
    for depth, tag in [(0, "a"), (1, "b"), (3, "d")]:
        assert _fetch(redis_client, depth) == tag
        assert _put_back(redis_client, tag, depth) == 1
        assert _queue(redis_client) == list("abcde"), f"after putting {tag} back {depth} deep"
    assert not redis_client.hlen("unacked") and not redis_client.zcard("unacked_index")
    assert _put_back(redis_client, "b", 1) == 0                     # not held any more: nothing pushed
    assert _queue(redis_client) == list("abcde")


def test_a_put_back_deeper_than_the_queue_goes_to_its_end(redis_client: redis.Redis) -> None:
    """The messages ahead were taken meanwhile (by another worker): it lands as deep as it can."""
    redis_client.lpush(QUEUE, *(_message(t) for t in "abc"))
    assert _fetch(redis_client, 2) == "c"
    redis_client.rpop(QUEUE)                                        # another worker took a
    assert _put_back(redis_client, "c", 2) == 1
    assert _queue(redis_client) == ["b", "c"]


def test_a_malformed_message_d_deep_is_a_dead_letter_and_the_fetch_takes_the_next(redis_client: redis.Redis) -> None:
    redis_client.lpush(QUEUE, _message("a"), "not json", _message("c"))
    assert _fetch(redis_client, 1) == "c"
    assert _queue(redis_client) == ["a"]
    assert redis_client.llen(LAYOUT.dead_letters(QUEUE)) == 1 and b"not json" in redis_client.lindex(LAYOUT.dead_letters(QUEUE), 0)
