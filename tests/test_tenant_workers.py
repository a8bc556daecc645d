"""Sharing a class between tenants with real workers and a real redis-server: a late tenant is
not stuck behind another's backlog, weights share the slots under contention, a quota is never
exceeded (sampled from what Redis holds, not from the tasks' own reports) while others use the
rest, and a tenant's usage is exactly zero once the cluster is idle after a worker was
SIGKILLed mid-task, a task was escalated to a bigger class, and Redis was killed and restarted.
Orders of starts are asserted, not durations: each task pushes its label as it starts
(``tests.apps.tenants.STARTS``)."""

from __future__ import annotations

import importlib
import os
import signal
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import redis

from sluice import App, keys
from sluice.deploy.embedded import EmbeddedRedis
from sluice.queues.broker.layout import RedisLayout
from tests.conftest import Workers, wait_for

WORKER = ("-c", "4", "--without-mingle", "--without-gossip")
NAP = 0.05


@pytest.fixture
def tenants(redis_server: EmbeddedRedis) -> ModuleType:
    return importlib.import_module("tests.apps.tenants")


def _starts(client: redis.Redis, module: ModuleType) -> list[str]:
    return [label.decode() for label in client.lrange(module.STARTS, 0, -1)]


def _held_per_tenant(client: redis.Redis) -> Counter[str]:
    """How many held messages charge each tenant now, read from the held charges themselves."""
    return Counter(record.split(b"\t")[1].decode() for record in client.hvals(keys.HELD_CHARGES))


def test_a_late_tenant_starts_within_a_few_rounds_while_another_has_two_thousand_waiting(
        tenants: ModuleType, workers: Workers, redis_client: redis.Redis) -> None:
    """light queues 2,000 naps on 4 slots; late sends 10 once light runs. Without tenants late
    would wait for all 2,000 (first in, first out); with equal weights each holds about 2 slots,
    so at most a few dozen of light's start between late's publish and late's last start."""
    workers.start("tests.apps.tenants", "cpu", "shared", *WORKER)
    tenants.nap.delay_many([("light", NAP)] * 2000, tenant="light")
    wait_for(lambda: redis_client.llen(tenants.STARTS) >= 20, 60, "light's backlog to be running")
    before = redis_client.llen(tenants.STARTS)
    late = tenants.nap.delay_many([("late", NAP)] * 10, tenant="late")
    late.get(timeout=60)
    starts = _starts(redis_client, tenants)
    last_late = max(i for i, label in enumerate(starts) if label == "late")
    light_between = starts[before:last_late].count("light")
    assert starts.count("late") == 10
    assert light_between <= 40, f"{light_between} of light's tasks started before late's 10 had all started"
    assert redis_client.llen("cpu~light") > 1000          # light's backlog was still deep all along


def test_weights_one_and_three_share_the_slots_a_quarter_and_three_quarters(
        tenants: ModuleType, workers: Workers, redis_client: redis.Redis) -> None:
    """light (weight 1) and heavy (weight 3) each queue 300 naps before a 4-slot worker starts:
    of the starts while both still wait, about three in four are heavy's."""
    tenants.nap.delay_many([("light", NAP)] * 300, tenant="light")
    tenants.nap.delay_many([("heavy", NAP)] * 300, tenant="heavy")
    workers.start("tests.apps.tenants", "cpu", "shared", *WORKER)
    wait_for(lambda: redis_client.llen(tenants.STARTS) >= 220, 90, "220 starts")
    window = _starts(redis_client, tenants)[20:220]
    heavy = window.count("heavy") / len(window)
    order = "".join(label[0] for label in window)
    assert 0.65 <= heavy <= 0.85, f"heavy took {heavy:.0%} of {len(window)} starts under contention: {order}"


def test_a_quota_of_one_slot_is_never_exceeded_and_the_other_slots_serve_others(
        tenants: ModuleType, workers: Workers, redis_client: redis.Redis) -> None:
    """capped (quota: 1 cpu, one nap) queues 10 naps of 0.3 s, and the default tenant 12: the
    held charges, sampled every 10 ms, never show two of capped's at once, and show the default
    tenant holding the other three slots."""
    capped = tenants.nap.delay_many([("capped", 0.3)] * 10, tenant="capped")
    others = tenants.nap.delay_many([("default", 0.3)] * 12)
    workers.start("tests.apps.tenants", "cpu", "shared", *WORKER)
    most: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    while not (capped.ready() and others.ready()) and time.monotonic() < deadline:
        for tenant, count in _held_per_tenant(redis_client).items():
            most[tenant] = max(most[tenant], count)
        time.sleep(0.01)
    assert capped.get(timeout=1) == ["capped"] * 10 and others.get(timeout=1) == ["default"] * 12
    assert most["capped"] == 1, most
    assert most["default"] == 3, most


def test_usage_is_exactly_zero_when_idle_after_a_worker_sigkill_and_an_escalation(
        workers: Workers, redis_server: EmbeddedRedis, redis_client: redis.Redis) -> None:
    """On the small ladder, tenant light's task is killed for memory on small and escalated to
    medium; tenant heavy's 1 s steps are running when their worker is SIGKILLed, and the reaper
    of the next worker puts them back. Every task ends SUCCESS, and then no usage and no charge
    is left in Redis."""
    ladder = importlib.import_module("tests.apps.ladder")
    fast = {"SLUICE_HEARTBEAT_INTERVAL": "0.2", "SLUICE_REAPER_INTERVAL": "0.5", "SLUICE_ORPHAN_GRACE": "4"}
    args = ("--queue", "medium", "--queue", "large", "-c", "2", "--without-mingle", "--without-gossip")
    first = workers.start("tests.apps.ladder", "small", "first", *args, env=fast)
    steps = [ladder.long_step.apply_async((1.0,), tenant="heavy") for _ in range(4)]
    wait_for(lambda: len(redis_client.keys("test:running:*")) >= 2, 30, "two of heavy's steps to run")
    assert _held_per_tenant(redis_client)["heavy"] == 2
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    workers.start("tests.apps.ladder", "small", "second", *args, env=fast)
    grown = ladder.grows.apply_async((200,), tenant="light")
    assert grown.get(timeout=60)["queue"] == "medium~light"    # escalated, still light's
    assert [step.get(timeout=60, propagate=False) and step.state for step in steps] == ["SUCCESS"] * 4
    wait_for(lambda: not redis_client.hlen(keys.HELD_CHARGES), 30, "every charge to be released")
    assert redis_client.hgetall(keys.TENANT_USAGE) == {}


def test_usage_is_exactly_zero_when_idle_after_redis_is_killed_and_restarted_mid_run(
        tenants: ModuleType, tmp_path: Path) -> None:
    """Twelve 1 s naps of tenant light on a 4-slot worker; Redis (every write on disk before its
    reply) is SIGKILLed while four run and restarted 2 s later. Every nap ends SUCCESS, and once
    idle no usage and no charge is left: they were written in the same atomic steps as the
    held messages, so the restart kept them exactly in step."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    client = server.client()
    client.config_set("appendfsync", "always")
    env = {"SLUICE_BROKER_URL": server.url, "SLUICE_HEARTBEAT_INTERVAL": "0.5", "SLUICE_REAPER_INTERVAL": "1"}
    pool = Workers(client, tmp_path)
    try:
        pool.start("tests.apps.tenants", "cpu", "restarted", *WORKER, env=env)
        sender = App("tests.tenants.sender", broker=server.url, classes=list(tenants.CLASSES))
        naps = [sender.send_task(tenants.nap.name, args=("light", 1.0), tenant="light") for _ in range(12)]
        wait_for(lambda: _held_per_tenant(client)["light"] >= 4, 60, "four of light's naps to be held")
        server.process.kill()
        server.process.wait(10)
        time.sleep(2)
        server.start()
        assert [nap.get(timeout=90, propagate=False) and nap.state for nap in naps] == ["SUCCESS"] * 12
        wait_for(lambda: not client.hlen(keys.HELD_CHARGES), 30, "every charge to be released")
        assert client.hgetall(keys.TENANT_USAGE) == {}
        assert not client.hlen(RedisLayout().unacked_key)
    finally:
        pool.stop_all()
        server.stop()


def test_a_plain_celery_producers_tenant_header_survives_the_intake_and_its_quota_holds(
        tenants: ModuleType, workers: Workers, redis_client: redis.Redis, redis_server: EmbeddedRedis) -> None:
    """Three naps from a stock Celery client, to Celery's default queue with only the one header
    line: the worker's admission forwards each to the cpu class keeping the tenant, and they run
    as capped's (the held charges say so), never two at once (capped's quota is one slot); once
    idle, no usage is left."""
    from celery import Celery

    producer = Celery("plain.producer", broker=redis_server.url, backend=redis_server.url)
    workers.start("tests.apps.tenants", "cpu", "intake", *WORKER)
    naps = [producer.send_task(tenants.nap.name, args=("plain", 0.4), headers={"sluice_tenant": "capped"})
            for _ in range(3)]
    most: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    while not all(nap.ready() for nap in naps) and time.monotonic() < deadline:
        for tenant, count in _held_per_tenant(redis_client).items():
            most[tenant] = max(most[tenant], count)
        time.sleep(0.01)
    assert [nap.get(timeout=1) for nap in naps] == ["plain"] * 3
    assert most["capped"] == 1 and set(most) <= {"capped", "default"}, most
    wait_for(lambda: not redis_client.hlen(keys.HELD_CHARGES), 30, "every charge to be released")
    assert redis_client.hgetall(keys.TENANT_USAGE) == {}      # forwarded, then run: nothing left over


def test_every_count_of_a_class_counts_every_tenants_messages(tenants: ModuleType, redis_client: redis.Redis) -> None:
    """Five waiting for cpu: two of the default tenant's, three of light's (one of them sent with
    a priority). sluice status, sluice metrics, kombu's size (Celery's view of a queue) and
    `celery purge` all see five; the tenants table shows light's three against its weight."""
    from prometheus_client import generate_latest
    from prometheus_client.core import CollectorRegistry

    from sluice.deploy.metrics import ClassMetrics, TenantMetrics
    from sluice.queues.status import class_status, tenant_status

    tenants.nap.delay_many([("default", 0)] * 2)
    tenants.nap.delay_many([("light", 0)] * 2, tenant="light")
    tenants.nap.apply_async(("light", 0), tenant="light", priority=6)
    catalog = tenants.app.catalog
    (cpu,) = [row for row in class_status(redis_client, catalog) if row.resource_class.name == "cpu"]
    assert cpu.queued == 5
    rows = {(row.queue, row.tenant): row for row in tenant_status(redis_client, catalog)}
    assert rows[("cpu", "light")].waiting == 3 and rows[("cpu", "light")].share.weight == 1
    assert rows[("cpu", "default")].waiting == 2 and rows[("cpu", "heavy")].waiting == 0
    registry = CollectorRegistry()
    registry.register(ClassMetrics(redis_client, catalog))
    registry.register(TenantMetrics(redis_client, catalog))
    text = generate_latest(registry).decode()
    assert 'sluice_queued{resource_class="cpu"} 5.0' in text
    assert 'sluice_tenant_waiting{resource_class="cpu",tenant="light"} 3.0' in text
    assert 'sluice_tenant_quota{resource="cpu",resource_class="cpu",tenant="capped"} 1.0' in text
    with tenants.app.connection_for_write() as connection:
        channel = connection.default_channel
        assert channel._size("cpu") == 5
        assert channel._purge("cpu") == 5
    assert [row.queued for row in class_status(redis_client, catalog) if row.resource_class.name == "cpu"] == [0]


def test_inside_a_tenant_priorities_hold_and_aging_ends_the_starvation_of_a_low_one(
        tenants: ModuleType, workers: Workers, redis_client: redis.Redis) -> None:
    """One slot, a bound of 2 s (``priority_max_wait``): behind a blocker, light queues 2 naps of
    priority 9, then 10 of priority 0 (0.3 s each). The first to start after the blocker is a
    priority-0 one; the priority-9 ones, overdue after 2 s, start before the last priority-0 ones."""
    workers.start("tests.apps.tenants", "cpu", "aging", "-c", "1", "--without-mingle", "--without-gossip",
                  env={"SLUICE_PRIORITY_MAX_WAIT": "2"})
    blocker = tenants.nap.apply_async(("block", 0.5), tenant="light")
    wait_for(lambda: redis_client.llen(tenants.STARTS) >= 1, 30, "the blocker to start")
    low = [tenants.nap.apply_async(("low", 0.3), tenant="light", priority=9) for _ in range(2)]
    high = [tenants.nap.apply_async(("high", 0.3), tenant="light", priority=0) for _ in range(10)]
    for call in (blocker, *low, *high):
        call.get(timeout=60)
    starts = _starts(redis_client, tenants)
    assert starts[:2] == ["block", "high"], starts
    last_low = max(i for i, label in enumerate(starts) if label == "low")
    assert last_low < max(i for i, label in enumerate(starts) if label == "high"), starts
