"""Flower's view: Celery's own event receiver (what Flower runs) gets a task-sent event for every
task sent, whether one ``.delay()`` at a time (a publish that waits for no reply from Redis) or
by ``delay_many`` (buffered, one event message per chunk), and still after Redis restarts."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest.mock import patch

import pytest

from sluice import App
from sluice.deploy.embedded import EmbeddedRedis
from tests.conftest import wait_for

pytestmark = pytest.mark.integration


@contextmanager
def task_sent_events(app: Any) -> Iterator[list[dict]]:
    """The task-sent events Celery's receiver gets while the block runs (subscribed before it starts)."""
    sent: list[dict] = []
    ready = threading.Event()
    receivers: list[Any] = []

    def listen() -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"task-sent": sent.append})
            receiver.on_consume_ready = lambda *args, **kwargs: ready.set()
            receivers.append(receiver)
            receiver.capture(limit=None, timeout=None, wakeup=False)     # until should_stop

    client = app.redis
    newest = max(int(c["id"]) for c in client.client_list())   # ids only grow: later clients are ours
    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert ready.wait(10), "the receiver did not start"
    # kombu subscribes (PSUBSCRIBE) once the receiver polls: publish only after Redis has it. Its
    # connection is one made since, with a pattern subscription (counting every client's patterns
    # would be thrown by an earlier receiver's going away meanwhile)
    wait_for(lambda: any(int(c["id"]) > newest and int(c.get("psub", 0)) > 0 for c in client.client_list()), 10,
             "the receiver's subscription in Redis")
    try:
        yield sent
    finally:
        receivers[0].should_stop = True
        thread.join(10)


def _expect(sent: list[dict], ids: list[str], queue: str) -> None:
    wait_for(lambda: len(sent) >= len(ids), 15, f"{len(ids)} task-sent events")
    assert sorted(e["uuid"] for e in sent) == sorted(ids)
    assert {e["queue"] for e in sent} == {queue}


def test_every_delay_and_every_delay_many_call_has_its_task_sent_event(basic_app: ModuleType) -> None:
    with task_sent_events(basic_app.app) as sent:
        ids = [basic_app.double.delay(i).id for i in range(20)]
        _expect(sent, ids, "cpu")
    with task_sent_events(basic_app.app) as sent:
        bulk = basic_app.double.delay_many(range(30), chunk=10, progress=False)
        _expect(sent, [r.id for r in bulk.results], "cpu")


def test_task_sent_events_flow_again_after_redis_restarts(tmp_path: Path) -> None:
    """kill -9 of Redis, started again on the same port: the next ``.delay()`` reconnects its
    reply-less event connection too, and its event reaches a receiver."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        app = App("tests.events", broker=server.url)
        task = app.task(name="tests.events.noop")(_noop)
        with task_sent_events(app) as sent:
            _expect(sent, [task.delay().id], "cpu")
        server.process.kill()
        server.process.wait(10)
        server.start()
        with task_sent_events(app) as sent:
            _expect(sent, [task.delay().id], "cpu")
    finally:
        server.stop()


def test_the_dispatcher_publishes_on_the_channel_the_message_kombus_producer_would(basic_app: ModuleType) -> None:
    """Celery's own dispatcher and sluice's publish the same event (same type, fields, clock)
    once each; on the wire the two messages are the same (the delivery tag, made per message,
    aside). Once the exchange is declared, sluice's goes past kombu's Producer (which fails
    here if it is used)."""
    from celery.events.dispatcher import EventDispatcher as CeleryDispatcher
    from kombu import Producer

    from sluice.events import EventDispatcher

    app, client = basic_app.app, basic_app.app.redis
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.psubscribe("*celeryev*")
    wait_for(lambda: pubsub.get_message(timeout=0.1) is None and client.pubsub_numpat() > 0, 10, "the subscription")
    fields = {"uuid": "id-1", "name": "tests.task", "args": "()", "kwargs": "{}", "retries": 0, "eta": None,
              "expires": None, "queue": "cpu", "exchange": "", "routing_key": "cpu", "root_id": "id-1", "parent_id": None}
    raw = []
    assert isinstance(app.events.Dispatcher(enabled=False), EventDispatcher), "the App installs sluice's dispatcher"
    with app.producer_or_acquire() as producer:
        for dispatcher_class in (CeleryDispatcher, EventDispatcher):
            dispatcher = dispatcher_class(producer.connection, hostname="h@x", enabled=False)
            dispatcher.publish("task-sent", fields, producer, blind=True)
            message = wait_for(lambda: pubsub.get_message(timeout=0.2), 10, "the event")
            raw.append(json.loads(message["data"]))
        with patch.object(Producer, "publish", side_effect=AssertionError("kombu's Producer was used")):
            EventDispatcher(producer.connection, hostname="h@x", enabled=False).publish("task-sent", fields, producer)
        assert wait_for(lambda: pubsub.get_message(timeout=0.2), 10, "the direct event")
    pubsub.close()
    for message in raw:
        message["properties"].pop("delivery_tag")
        message["body"] = json.loads(base64.b64decode(message["body"]))
        message["body"].pop("timestamp")
    assert raw[0] == raw[1]
    assert raw[1]["body"]["type"] == "task-sent" and raw[1]["body"]["uuid"] == "id-1"


def _noop() -> None:
    """A task body that does nothing (no worker runs it here)."""


