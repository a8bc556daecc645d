"""The formats a Lua script writes are the ones Python defines (``sluice.queues.broker.bells``,
``sluice.queues.broker.letters``), on a real Redis: a bell rung by ``forward.lua`` holds the
tokens ``bells.ring`` pushes, trimmed to the same cap, and the dead letter ``fetch.lua`` writes
decodes with :meth:`DeadLetter.decode` field for field."""

from __future__ import annotations

import json
import time

import redis

from sluice.queues.broker.fetching import FetchCall
from sluice.queues.broker import bells, scripts
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.broker.letters import DEAD_LETTER_CAP, DeadLetter

LAYOUT = RedisLayout()
QUEUE = "work"


def _message(tag: str) -> str:
    return json.dumps({"body": "", "headers": {}, "properties": {
        "delivery_tag": tag, "delivery_info": {"exchange": "", "routing_key": QUEUE}}})


def _forward(client: redis.Redis, tag: str) -> int:
    client.hset(LAYOUT.unacked(), tag, json.dumps([json.loads(_message(tag)), "", QUEUE]))
    keys = LAYOUT.unhold_keys()
    return int(scripts.run(client, "forward", [*keys[:2], QUEUE, LAYOUT.bell(QUEUE), "forwarded", *keys[2:],
                                               LAYOUT.tenant_lines(QUEUE)], [tag, _message(tag), bells.BELL_CAP, "", "", ""]))


def test_a_forward_rings_the_bell_with_the_token_and_cap_python_rings_with(redis_client: redis.Redis) -> None:
    bells.ring(redis_client.pipeline(), "python-bell").execute()
    assert _forward(redis_client, "a") == 1
    assert redis_client.lrange(LAYOUT.bell(QUEUE), 0, -1) == redis_client.lrange("python-bell", 0, -1)
    bells.ring_times(redis_client.pipeline(), "python-bell", bells.BELL_CAP + 5).execute()
    for n in range(bells.BELL_CAP + 5):
        _forward(redis_client, f"t{n}")
    assert redis_client.llen(LAYOUT.bell(QUEUE)) == redis_client.llen("python-bell") == bells.BELL_CAP
    assert set(redis_client.lrange(LAYOUT.bell(QUEUE), 0, -1)) == {str(bells.TOKEN).encode()}


def test_the_dead_letter_fetch_lua_writes_decodes_field_for_field(redis_client: redis.Redis) -> None:
    raw = b'{"body": "no delivery tag", "properties": {}}\xff'
    redis_client.lpush(QUEUE, raw)
    now = round(time.time(), 3)  # cjson writes 14 significant digits: a tenth of a millisecond
    reply = scripts.run(redis_client, "fetch", *FetchCall.of(LAYOUT, [(QUEUE, False, None)]).arguments(now, False, "", 0))
    assert reply == [1]
    entry = redis_client.lindex(LAYOUT.dead_letters(QUEUE), 0)
    letter = DeadLetter.decode(entry)
    assert letter == DeadLetter("not JSON", QUEUE, now, raw)
    assert DeadLetter.decode(letter.encode()) == letter   # and Python's own record reads the same way
    assert redis_client.get(LAYOUT.dead_letter_count(QUEUE)) == b"1"
