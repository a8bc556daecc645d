"""The fetch script's choice between tenants, run by hand on a real Redis (no worker: each fetch
is one call, so every rule is checked message by message): the lowest weighted dominant share
first, quotas that block one tenant and no other, a plain producer's tenant header honoured,
priorities inside a tenant, and usage that is exactly the held messages' charges, back to zero
when every one is acknowledged, forwarded or restored."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from sluice import keys
from sluice.compute import Compute
from sluice.headers import CHARGE, SENT, TENANT
from sluice.queues.broker import scripts
from sluice.queues.broker.fetching import FetchCall
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.catalog import ResourceClass
from sluice.tenants import Share, tenant_queue

LAYOUT = RedisLayout()
POOL = ResourceClass(
    "pool",
    Compute(cpu="1", memory="1Gi"),
    slots=4,
    tenants={"light": Share(weight=1), "heavy": Share(weight=3), "capped": Share(quota=Compute(cpu="2"))},
)
FETCH = FetchCall.of(LAYOUT, [(POOL.name, False, POOL.fetch_terms())], priority_wait=300)
SLOT = "1000 1073741824 0"
_published = 0


def _publish(client: redis.Redis, tenant: str | None, charge: str | None = SLOT, priority: int = 0,
             header_only: bool = False, sent: float | None = None) -> str:
    """A message for ``tenant`` as a sluice producer publishes it: on its tenant's queue, the
    tenant listed (``header_only``: as a plain Celery producer, on the class's own queue with
    the header alone). Returns its delivery tag."""
    global _published
    _published += 1
    tag = f"{tenant or 'default'}-{_published}"
    headers: dict[str, Any] = {}
    if tenant:
        headers[TENANT] = tenant
    if charge:
        headers[CHARGE] = charge
    if sent is not None:
        headers[SENT] = sent
    queue = POOL.name if header_only or tenant is None else tenant_queue(POOL.name, tenant)
    message = {"body": "", "headers": headers, "properties": {
        "delivery_tag": tag, "priority": priority, "delivery_info": {"exchange": "", "routing_key": queue}}}
    step = next(s for s in reversed(LAYOUT.priority_steps) if s <= priority)
    client.lpush(f"{queue}{LAYOUT.sep}{step}" if step else queue, json.dumps(message))
    if tenant and not header_only:
        client.sadd(keys.tenant_lines(POOL.name), tenant)
    return tag


def _fetch(client: redis.Redis, acks: list[str] = ()) -> str | None:  # type: ignore[assignment]
    reply = scripts.run(client, "fetch", *FETCH.arguments(time.time(), False, "", 0, acks))
    return reply[3].decode() if len(reply) > 1 else None


def _tenant(tag: str | None) -> str | None:
    return None if tag is None else tag.rsplit("-", 1)[0]


def _usage(client: redis.Redis) -> dict[str, int]:
    return {field.decode(): int(value) for field, value in client.hgetall(keys.TENANT_USAGE).items()}


def test_a_late_tenant_is_taken_next_ahead_of_a_deep_backlog(redis_client: redis.Redis) -> None:
    """light has 500 waiting and holds 2 slots; default sends 1 later: the next fetch takes it."""
    for _ in range(500):
        _publish(redis_client, "light")
    assert [_tenant(_fetch(redis_client)) for _ in range(2)] == ["light", "light"]
    _publish(redis_client, None)
    assert _tenant(_fetch(redis_client)) == "default"         # its share 0 slots, light's 2
    assert _tenant(_fetch(redis_client)) == "light"           # default has nothing more waiting
    assert redis_client.llen(tenant_queue(POOL.name, "light")) == 497


def test_weights_share_the_slots_one_to_three_under_contention(redis_client: redis.Redis) -> None:
    """light (weight 1) and heavy (weight 3) both flood; of 8 slots taken and held, heavy holds 6."""
    for _ in range(50):
        _publish(redis_client, "light")
        _publish(redis_client, "heavy")
    taken = [_tenant(_fetch(redis_client)) for _ in range(8)]
    assert taken.count("heavy") == 6 and taken.count("light") == 2, taken
    usage = _usage(redis_client)
    assert usage["pool\theavy\tcpu"] == 6000 and usage["pool\tlight\tcpu"] == 2000


def test_a_tenant_at_its_quota_waits_and_blocks_nobody_else(redis_client: redis.Redis) -> None:
    """capped may hold 2 cpus: its third message waits (back at the head of its queue) while
    default's are taken; once one of capped's is acknowledged, its next one is taken."""
    capped = [_publish(redis_client, "capped") for _ in range(5)]
    assert [_fetch(redis_client) for _ in range(2)] == capped[:2]
    assert _fetch(redis_client) is None                        # at its quota, and nobody else waits
    assert redis_client.llen(tenant_queue(POOL.name, "capped")) == 3
    other = _publish(redis_client, None)
    assert _fetch(redis_client) == other                       # capped blocks nobody
    assert _fetch(redis_client, acks=[capped[0]]) == capped[2]  # an ack carried by the fetch frees room
    assert _usage(redis_client)["pool\tcapped\tcpu"] == 2000


def test_a_message_bigger_than_what_is_left_of_the_quota_waits_for_room(redis_client: redis.Redis) -> None:
    _publish(redis_client, "capped", charge="1500 0 0")
    big = _publish(redis_client, "capped", charge="1500 0 0")
    assert _fetch(redis_client) is not None
    assert _fetch(redis_client) is None                        # 1500 + 1500 > 2000
    assert _fetch(redis_client, acks=[f"capped-{_published - 1}"]) == big


def test_a_plain_producers_tenant_header_moves_its_message_to_its_tenants_line(redis_client: redis.Redis) -> None:
    """A message on the class's own queue naming tenant heavy is charged to heavy, and the
    share rule sees heavy from then on."""
    tag = _publish(redis_client, "heavy", header_only=True)
    assert not redis_client.sismember(keys.tenant_lines(POOL.name), "heavy")
    assert _fetch(redis_client) == tag
    assert _usage(redis_client) == {"pool\theavy\tcpu": 1000, "pool\theavy\tmemory": 1 << 30}


def test_a_message_without_a_charge_header_charges_one_slot(redis_client: redis.Redis) -> None:
    _publish(redis_client, "light", charge=None)
    _fetch(redis_client)
    assert _usage(redis_client) == {"pool\tlight\tcpu": 1000, "pool\tlight\tmemory": 1 << 30}


def test_inside_a_tenant_the_lower_priority_step_goes_first(redis_client: redis.Redis) -> None:
    low = [_publish(redis_client, "light", priority=9) for _ in range(2)]
    high = [_publish(redis_client, "light", priority=0) for _ in range(2)]
    assert [_fetch(redis_client) for _ in range(4)] == high + low


def test_a_low_priority_message_waiting_past_the_bound_goes_ahead_of_higher_ones(redis_client: redis.Redis) -> None:
    """Aging: priority 9 published 400 s ago against a bound of 300 s is taken before priority 0
    work of its tenant; one published 200 s ago is not; the oldest overdue step goes first."""
    now = time.time()
    recent = _publish(redis_client, "light", priority=9, sent=now - 200)
    high = _publish(redis_client, "light", priority=0)
    assert _fetch(redis_client) == high                      # 200 s: within the bound
    overdue = _publish(redis_client, "light", priority=6, sent=now - 400)
    older = _publish(redis_client, "light", priority=3, sent=now - 900)
    _publish(redis_client, "light", priority=0)
    assert [_fetch(redis_client) for _ in range(2)] == [older, overdue]
    assert recent not in (older, overdue)


def test_a_tenant_whose_queues_are_empty_leaves_the_tenant_set(redis_client: redis.Redis) -> None:
    _publish(redis_client, "light")
    _fetch(redis_client)
    assert redis_client.sismember(keys.tenant_lines(POOL.name), "light")   # listed until a fetch finds it empty
    assert _fetch(redis_client) is None
    assert not redis_client.sismember(keys.tenant_lines(POOL.name), "light")


def test_usage_is_exactly_zero_once_every_held_message_is_acknowledged_forwarded_or_restored(
        redis_client: redis.Redis) -> None:
    """Twelve messages of four tenants held; four acknowledged by a fetch, four by the ack
    script (a channel's flush, a dead letter), four forwarded (admission; kombu's restore and
    the reaper's run the same script): no usage and no charge is left."""
    for tenant in ("light", "heavy", "capped", "light", "heavy", None) * 2:
        _publish(redis_client, tenant)
    held = [tag for tag in (_fetch(redis_client) for _ in range(12)) if tag]
    assert len(held) == 12 and _usage(redis_client)
    _fetch(redis_client, acks=held[:4])
    scripts.run(redis_client, "ack", LAYOUT.unhold_keys(), held[4:8])
    unhold = LAYOUT.unhold_keys()
    for tag in held[8:]:
        moved = scripts.run(redis_client, "forward", [*unhold[:2], "elsewhere", LAYOUT.bell("elsewhere"),
                                                      keys.FORWARDED, *unhold[2:], LAYOUT.tenant_lines("elsewhere")],
                            [tag, "{}", 1000, "", "", ""])
        assert moved == 1
    assert _usage(redis_client) == {}
    assert redis_client.hlen(keys.HELD_CHARGES) == 0 and redis_client.hlen(LAYOUT.unacked()) == 0


def test_a_quota_lowered_while_tasks_run_lets_them_finish_and_starts_nothing_until_usage_is_under_it(
        redis_client: redis.Redis) -> None:
    """capped holds 2 cpus under its quota of 2; workers with a quota of 1 deployed: nothing of
    capped's starts until both held ones end (usage 0 + 1 fits), and others are not held up."""
    held = [_publish(redis_client, "capped") for _ in range(2)]
    waiting = _publish(redis_client, "capped")
    assert [_fetch(redis_client) for _ in range(2)] == held
    lowered = ResourceClass("pool", POOL.slot, slots=4, tenants={"capped": Share(quota=Compute(cpu="1"))})
    fetch = FetchCall.of(LAYOUT, [(POOL.name, False, lowered.fetch_terms())])

    def fetch_lowered(acks: list[str] = ()) -> str | None:  # type: ignore[assignment]
        reply = scripts.run(redis_client, "fetch", *fetch.arguments(time.time(), False, "", 0, acks))
        return reply[3].decode() if len(reply) > 1 else None

    assert fetch_lowered() is None
    assert fetch_lowered(acks=held[:1]) is None               # 1 held: 1 + 1 is over the new quota
    assert fetch_lowered(acks=held[1:]) == waiting


def test_a_malformed_message_on_a_tenants_queue_is_a_dead_letter_of_its_class_and_the_next_is_taken(
        redis_client: redis.Redis) -> None:
    good = _publish(redis_client, "light")
    redis_client.rpush(tenant_queue(POOL.name, "light"), b"not json")      # at the head of light's line
    assert _fetch(redis_client) == good
    assert redis_client.llen(LAYOUT.dead_letters(POOL.name)) == 1


def test_a_message_that_could_never_fit_its_tenants_quota_is_taken_for_the_worker_to_fail(
        redis_client: redis.Redis) -> None:
    """capped may hold 2 cpus; a plain producer's 3-cpu task would wait forever: the fetch takes
    it (charged as it is), and admission ends it with OverQuota (tests/test_tenants.py)."""
    huge = _publish(redis_client, "capped", charge="3000 0 0")
    assert _fetch(redis_client) == huge
