"""Big calls and big results against a real redis-server at its default limits and a real worker.

Redis cuts off a pub/sub subscriber whose output buffer passes 32 MB
(``client-output-buffer-limit pubsub 32mb 8mb 60``), so a result meta published whole, with a
call's 60 MB argument in it (``result_extended``), cost the caller its subscription and the
result; and a result published while a subscription was down was never seen. These tests hold
that what ``.get()`` waits for reaches the caller whatever the size of the call or the value,
and that Redis cuts no one off for it (it logs every cut: "overcoming of output buffer limits").
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import ModuleType

import psutil
import pytest
import redis

from sluice.deploy.embedded import EmbeddedRedis
from tests.conftest import Workers, wait_for

pytestmark = pytest.mark.integration

MB = 1 << 20
ARGS = ("-c", "1", "--without-mingle", "--without-gossip")
#: What redis-server logs for each client it disconnects for its output buffer.
CUT_OFF = "overcoming of output buffer limits"


@pytest.fixture
def big_args(redis_server: EmbeddedRedis) -> ModuleType:
    """tests.apps.big_args, imported once SLUICE_BROKER_URL points at the test server."""
    import importlib

    return importlib.import_module("tests.apps.big_args")


def _cut_offs(server: EmbeddedRedis) -> int:
    return (Path(server.data_dir) / "redis.log").read_text(errors="replace").count(CUT_OFF)


def test_a_60mb_argument_returns_five_times_in_a_row_and_its_stored_state_stays_small(
        redis_server: EmbeddedRedis, redis_client: redis.Redis, workers: Workers, big_args: ModuleType) -> None:
    """Five ``.delay()`` calls with a 60 MB argument each return their value from ``.get()``, one
    after another in one process, and a small call after them does too; each stored meta is a
    couple of KiB, its arguments a repr cut to Celery's ``argsrepr`` bound; Redis keeps its
    default pub/sub limit and cuts off no subscriber."""
    limits = redis_client.config_get("client-output-buffer-limit")["client-output-buffer-limit"]
    assert "pubsub 33554432 8388608 60" in limits, limits
    workers.start("tests.apps.big_args", "cpu", "big1", *ARGS)
    cut_offs, data = _cut_offs(redis_server), "a" * (60 * MB)
    for _ in range(5):
        result = big_args.measure.delay(data)
        assert result.get(timeout=30) == len(data)
        stored = redis_client.get(big_args.app.backend.get_key_for_task(result.id))
        assert stored is not None and len(stored) < 4096, len(stored or b"")
        args = json.loads(stored)["args"]
        assert isinstance(args, str) and args.startswith("['aaaa") and len(args) <= 1100, args[:80]
    assert big_args.blob.delay(3).get(timeout=10) == "rrr"
    assert _cut_offs(redis_server) == cut_offs


def test_a_40mb_return_value_reaches_the_caller_without_cutting_off_its_subscription(
        redis_server: EmbeddedRedis, redis_client: redis.Redis, workers: Workers, big_args: ModuleType) -> None:
    """A value bigger than Redis's 32 MB pub/sub limit is stored whole and announced by a small
    notice: ``.get()`` returns it, and Redis cut off no subscriber (a whole meta published would
    have been)."""
    workers.start("tests.apps.big_args", "cpu", "big2", *ARGS)
    cut_offs = _cut_offs(redis_server)
    result = big_args.blob.delay(40 * MB)
    assert result.get(timeout=30) == "r" * (40 * MB)
    assert redis_client.strlen(big_args.app.backend.get_key_for_task(result.id)) > 40 * MB
    assert _cut_offs(redis_server) == cut_offs


def test_a_result_stored_while_the_callers_subscription_is_down_is_still_returned(
        redis_client: redis.Redis, workers: Workers, big_args: ModuleType) -> None:
    """The caller's subscription is cut while it waits, and the task's result is stored and
    published after the consumer re-read the stored state but before it subscribed again:
    ``.get()`` still returns it (the consumer reads the stored states again once subscribed).
    The task's 40 MB progress state makes that re-read long, so the result is likely to land in
    that window; the test releases the task when the re-read has begun."""
    workers.start("tests.apps.big_args", "cpu", "big3", *ARGS)
    release = "tests:big-args:release"
    result = big_args.report_then_hold.delay(release, 40 * MB, 30)
    key = big_args.app.backend.get_key_for_task(result.id)
    wait_for(lambda: (redis_client.strlen(key) or 0) > 40 * MB, 30, "the task's progress state", interval=0.005)
    errors: list[BaseException] = []
    cutter = threading.Thread(target=_cut_then_release, args=(redis_client, key, release, errors), daemon=True)
    cutter.start()
    assert result.get(timeout=20) == "held"
    cutter.join(10)
    assert not errors, errors


def test_a_result_published_while_redis_py_reconnects_the_subscriber_on_its_own_is_still_returned(
        redis_server: EmbeddedRedis, redis_client: redis.Redis) -> None:
    """With redis-py allowed to retry (Celery's ``redis_retry_on_timeout``), the caller's
    subscriber is cut off in the middle of a message (as Redis does when its output buffer
    passes the limit with a message in flight), and the result is stored and published (SET
    then PUBLISH, as Celery's backend does) in the same step, before any reconnect: redis-py
    reconnects and subscribes again on its own, inside the read, so Celery never learns of it;
    ``.get()`` still returns the result (the consumer reads the stored states again after any
    reconnect). The test stores the result itself: it is the one that lands in that gap."""
    from sluice import App

    caller = App("tests.big_args.retrying", broker=redis_server.url)
    caller.conf.redis_retry_on_timeout = True
    result = caller.AsyncResult("big-args-reconnect-1")
    key = caller.backend.get_key_for_task(result.id)
    errors: list[BaseException] = []
    cutter = threading.Thread(target=_cut_mid_message_then_store, args=(redis_client, key, result.id, errors),
                              daemon=True)
    cutter.start()
    assert result.get(timeout=10) == "stored"
    cutter.join(10)
    assert not errors, errors


def _cut_mid_message_then_store(client: redis.Redis, channel: bytes, task_id: str,
                                errors: list[BaseException]) -> None:
    """Once this process subscribes to ``channel``: publish a 16 MB progress state on it (under the 32 MB limit), and at
    once (while it is in flight) disconnect the subscriber and store and publish the success,
    in one transaction."""
    try:
        wait_for(lambda: client.pubsub_numsub(channel)[0][1] == 1, 20, "the caller to subscribe", interval=0.005)
        subscribers = [c for c in _own_clients(client) if int(c["sub"])]
        assert len(subscribers) == 1, subscribers
        progress = {"task_id": task_id, "status": "PROGRESS", "result": "p" * (16 * MB), "traceback": None,
                    "children": [], "date_done": None}
        success = json.dumps({"task_id": task_id, "status": "SUCCESS", "result": "stored", "traceback": None,
                              "children": [], "date_done": None})
        client.publish(channel, json.dumps(progress))
        cut = client.pipeline(transaction=True)
        cut.execute_command("CLIENT", "KILL", "ID", subscribers[0]["id"])
        cut.set(channel, success, ex=600)
        cut.publish(channel, success)
        cut.execute()
    except BaseException as exc:  # handed to the test's thread
        errors.append(exc)


def _cut_then_release(client: redis.Redis, channel: bytes, release: str, errors: list[BaseException]) -> None:
    """Once this process subscribes to ``channel``, disconnect its subscriber; once its consumer
    has re-read the stored states (an MGET from this process), let the task finish."""
    try:
        wait_for(lambda: client.pubsub_numsub(channel)[0][1] == 1, 20, "the caller to subscribe", interval=0.005)
        subscribers = [c for c in _own_clients(client) if int(c["sub"])]
        assert len(subscribers) == 1, subscribers
        client.execute_command("CLIENT", "KILL", "ID", subscribers[0]["id"])
        wait_for(lambda: any(c["cmd"] == "mget" for c in _own_clients(client)), 10, "the consumer's re-read", interval=0.005)
        client.set(release, 1)
    except BaseException as exc:  # handed to the test's thread
        errors.append(exc)
        client.set(release, 1)


def _own_clients(client: redis.Redis) -> list[dict[str, str]]:
    """The server's clients connected from this process (by their local ports)."""
    ports = {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.laddr}
    return [c for c in client.client_list() if int(c["addr"].rsplit(":", 1)[1]) in ports]


