"""Reliable fetch and dead letters, against a real redis-server and real workers: a message is
always in Redis (a queue, the unacked hash or a dead-letter list), and no input on a queue can
stop a worker."""

from __future__ import annotations

import base64
import json
import os
import signal
import time
import uuid

import pytest
import redis
from celery.exceptions import NotRegistered
from click.testing import CliRunner

from sluice.cli import main
from sluice.deploy.embedded import EmbeddedRedis
from sluice.queues import dead_letters
from sluice.queues.broker import letters, scripts
from sluice.queues.broker.layout import RedisLayout
from tests.conftest import Workers, consuming_channel, fetch_by_hand, wait_for

pytestmark = pytest.mark.integration

FAST_RECOVERY = {"SLUICE_HEARTBEAT_INTERVAL": "0.2", "SLUICE_REAPER_INTERVAL": "0.5", "SLUICE_ORPHAN_GRACE": "2"}
ARGS = ("-c", "1", "--without-mingle", "--without-gossip")
LAYOUT = RedisLayout()


def _in_redis(client: redis.Redis, queue: str) -> int:
    """How many copies of messages Redis holds for ``queue``: waiting plus held unacknowledged."""
    return LAYOUT.queue_depth(client, queue) + len([h for h in LAYOUT.held(client) if h.queue == queue])


def _blocked(client: redis.Redis) -> list[str]:
    """The connections Redis holds blocked in a command (an idle worker's wait on its bells)."""
    return [c["addr"] for c in client.client_list() if "b" in c["flags"]]


def test_a_task_sent_to_a_stopped_worker_that_is_then_killed_still_runs(redis_client: redis.Redis, workers: Workers,
                                                                        basic_app) -> None:  # noqa: ANN001
    """The window that lost tasks with kombu's BRPOP: the worker is SIGSTOPped while it waits
    for work, a task is sent, the worker is SIGKILLed. The message is in Redis all along, and
    the next worker runs it."""
    victim = workers.start("tests.apps.basic", "cpu", "stopped", *ARGS, env=FAST_RECOVERY)
    wait_for(lambda: _blocked(redis_client), 30, "the idle worker to block on the queue's bell")
    os.killpg(victim.pid, signal.SIGSTOP)
    result = basic_app.default_task.delay()
    # the stopped worker's blocking command has been answered (the bell's token, or its timeout):
    # a BRPOP on the queue itself would now have handed the message to a process that never reads it
    wait_for(lambda: not _blocked(redis_client), 30, "the stopped worker's wait to be answered")
    assert _in_redis(redis_client, "cpu") == 1
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    workers.start("tests.apps.basic", "cpu", "next", *ARGS, env=FAST_RECOVERY)
    assert result.get(timeout=60)["worker"] == "next@test"


def test_a_worker_killed_after_storing_a_result_before_its_ack_reached_redis_runs_nothing_twice(
        redis_client: redis.Redis, workers: Workers, basic_app) -> None:  # noqa: ANN001
    """The worst instant for an acknowledgement (which reaches Redis with the worker's next
    fetch): the task's success is stored, the worker's main process is stopped before it has
    acknowledged the message (the task stops it), and the worker is SIGKILLed. The message is
    still held in Redis; the next worker's reaper puts it back, the worker that receives it
    sees the stored success and does not run the body again, and no copy is left in Redis."""
    victim = workers.start("tests.apps.basic", "cpu", "frozen", *ARGS, env=FAST_RECOVERY)
    result = basic_app.freeze_worker_then_return.delay("test:frozen-runs")
    assert result.get(timeout=30) == "done"
    assert _in_redis(redis_client, "cpu") == 1, "the stopped worker still holds the message"
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    workers.start("tests.apps.basic", "cpu", "next", *ARGS, env=FAST_RECOVERY)
    wait_for(lambda: _in_redis(redis_client, "cpu") == 0, 30, "the held message to be put back and dropped")
    assert redis_client.get("test:frozen-runs") == b"1"
    assert result.get(timeout=5) == "done"


def test_an_ack_is_carried_by_the_next_fetch_or_flushed_when_none_comes(
        redis_client: redis.Redis, basic_app) -> None:  # noqa: ANN001
    """On the sluice transport an acknowledgement is not a round trip of its own: after ack the
    message is still in Redis's unacked hash, the channel's next fetch removes it (and takes the
    next message); an ack while the channel waits on its bells (no fetch for up to a second)
    goes out at once; an ack with no fetch after it is sent before the channel puts back what it
    holds (as it does when closing), so an acknowledged message is not put back."""
    queue = "ack-test"
    with basic_app.app.connection_for_write() as connection:
        channel = consuming_channel(connection, queue, 2)
        tags = []
        for _ in range(2):
            tags.append(fetch_by_hand(channel, queue))
            channel.qos.ack(tags[-1])
            assert redis_client.hexists(LAYOUT.unacked_key, tags[-1]), "acknowledged here, not yet in Redis"
            if len(tags) == 2:
                assert not redis_client.hexists(LAYOUT.unacked_key, tags[0]), "the second fetch carried the first ack"
        channel.fetched.add(tags[1])
        channel.qos.append(None, tags[1])  # held again (by hand), to ack while waiting on the bells
        redis_client.hset(LAYOUT.unacked_key, tags[1], "x")
        channel._waiting = True
        channel.qos.ack(tags[1])
        assert not redis_client.hexists(LAYOUT.unacked_key, tags[1]), "waiting on the bells, the ack went out at once"
        channel._waiting = False
        channel.qos.restore_unacked()
        assert not redis_client.hexists(LAYOUT.unacked_key, tags[1]) and not redis_client.zscore(
            LAYOUT.unacked_index_key, tags[1])
        assert redis_client.llen(queue) == 0, "an acknowledged message was put back"
        channel.close()


def test_a_fetched_eta_task_whose_worker_is_killed_runs_once_on_the_next(redis_client: redis.Redis, workers: Workers,
                                                                         basic_app) -> None:  # noqa: ANN001
    """A worker takes a countdown task (it is now held, in Redis's unacked hash, not yet
    claimed) and is SIGKILLed before its time; the next worker's reaper restores it once the
    countdown and the orphan grace have passed, and it runs."""
    victim = workers.start("tests.apps.basic", "cpu", "holder", *ARGS, env=FAST_RECOVERY)
    result = basic_app.default_task.apply_async(countdown=3)
    wait_for(lambda: LAYOUT.held(redis_client), 20, "the worker to take the countdown task")
    assert LAYOUT.queue_depth(redis_client, "cpu") == 0
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    workers.start("tests.apps.basic", "cpu", "heir", *ARGS, env=FAST_RECOVERY)
    assert result.get(timeout=60)["worker"] == "heir@test"


def _envelope(body: bytes, task: str, **properties: object) -> dict[str, object]:
    task_id = str(uuid.uuid4())
    return {"body": base64.b64encode(body).decode(), "content-encoding": "utf-8", "content-type": "application/json",
            "headers": {"lang": "py", "task": task, "id": task_id, "root_id": task_id, "argsrepr": "()",
                        "kwargsrepr": "{}", "origin": "test"},
            "properties": {"body_encoding": "base64", "delivery_mode": 2, "delivery_tag": str(uuid.uuid4()),
                           "delivery_info": {"exchange": "", "routing_key": "cpu"}, "priority": 0, **properties}}


MALFORMED: dict[str, bytes] = {
    "not JSON": b"{not json",
    "a JSON list": b"[1, 2, 3]",
    "binary": bytes(range(256)),
    "50 MB of garbage": b"\xde\xad" * (25 << 20),
    "a JSON number": b"12345",
    "no properties": json.dumps({"body": "e30=", "headers": {}}).encode(),
    "a body that is not base64": json.dumps({**_envelope(b"[]", "tests.apps.basic.default_task"),
                                             "body": "!!!not-base64"}).encode(),
    "an unregistered task": json.dumps(_envelope(b"[[], {}, {}]", "no.such.task")).encode(),
}


def test_malformed_messages_become_dead_letters_and_the_worker_keeps_serving(
        redis_client: redis.Redis, workers: Workers, basic_app) -> None:  # noqa: ANN001
    """Eight kinds of bad message pushed straight onto a class queue: each is moved, with its
    reason, to the queue's dead letters; the worker stays up and runs the next real task;
    the unregistered task's caller gets NotRegistered; `sluice dead-letters` lists, requeues
    and purges them."""
    worker = workers.start("tests.apps.basic", "cpu", "sturdy", *ARGS)
    for raw in MALFORMED.values():
        redis_client.lpush("cpu", raw)
    unregistered_id = json.loads(MALFORMED["an unregistered task"])["headers"]["id"]
    wait_for(lambda: redis_client.llen(LAYOUT.dead_letters("cpu")) == len(MALFORMED), 60, "eight dead letters")
    assert basic_app.default_task.delay().get(timeout=30)["worker"] == "sturdy@test"
    assert worker.poll() is None
    wait_for(lambda: LAYOUT.held(redis_client) == [], 10, "nothing left wedged as unacknowledged")
    letters = [letter for _, letter in dead_letters.read(redis_client, LAYOUT, "cpu", 0, 100)]
    assert sorted(letter.raw for letter in letters) == sorted(MALFORMED.values())  # each kept intact
    reasons = {letter.raw: letter.reason for letter in letters}
    assert reasons[MALFORMED["not JSON"]] == "not JSON"
    assert reasons[MALFORMED["a JSON list"]] == "not a JSON object"
    assert "Error" in reasons[MALFORMED["a body that is not base64"]]
    assert reasons[MALFORMED["an unregistered task"]].startswith("unregistered task")
    with pytest.raises(NotRegistered):
        basic_app.app.AsyncResult(unregistered_id).get(timeout=10)
    assert int(redis_client.get(LAYOUT.dead_letter_count("cpu"))) == len(MALFORMED)

    env = {"SLUICE_BROKER_URL": os.environ["SLUICE_BROKER_URL"]}
    listing = CliRunner().invoke(main, ["dead-letters", "list"], env=env)
    assert listing.exit_code == 0 and "cpu" in listing.output and "8" in listing.output, listing.output
    number = [letter.raw for letter in letters].index(MALFORMED["a JSON number"])
    requeued = CliRunner().invoke(main, ["dead-letters", "requeue", "cpu", "-n", str(number)], env=env)
    assert requeued.exit_code == 0 and "requeued 1" in requeued.output, requeued.output
    wait_for(lambda: int(redis_client.get(LAYOUT.dead_letter_count("cpu"))) == len(MALFORMED) + 1, 30,
             "the requeued garbage to come back as a dead letter")
    purged = CliRunner().invoke(main, ["dead-letters", "purge", "cpu", "--yes"], env=env)
    assert purged.exit_code == 0 and f"purged {len(MALFORMED)}" in purged.output, purged.output
    assert redis_client.llen(LAYOUT.dead_letters("cpu")) == 0
    assert worker.poll() is None


def test_a_control_reply_the_client_cannot_read_raises_for_it_and_leaves_no_dead_letter(
        redis_client: redis.Redis, workers: Workers, basic_app) -> None:  # noqa: ANN001
    """A control client whose accept_content leaves out JSON (the worker replies in JSON) gets
    Celery's ContentDisallowed from ``inspect().ping()``, as on kombu's own Redis transport, and
    its reply queue leaves no dead-letter list or counter behind (replies are at-most-once: a
    no-ack consumer's). The same ping from a client that accepts JSON is answered."""
    from kombu.exceptions import ContentDisallowed

    from sluice import App

    workers.start("tests.apps.basic", "cpu", "replier", *ARGS)
    answered = wait_for(lambda: basic_app.app.control.inspect(destination=["replier@test"], timeout=2).ping(), 30,
                        "the worker to answer a ping")
    assert answered == {"replier@test": {"ok": "pong"}}
    refusing = App("tests.replies.client", broker=os.environ["SLUICE_BROKER_URL"])
    refusing.conf.accept_content = ["application/x-not-json"]
    with pytest.raises(ContentDisallowed):
        refusing.control.inspect(destination=["replier@test"], timeout=5).ping()
    assert dead_letters.summary(redis_client, LAYOUT) == []
    assert [key for key in redis_client.keys("*") if b"reply" in key] == []   # nothing of the reply queue is left


def test_a_malformed_message_on_a_no_ack_consumers_list_is_dropped_not_kept(
        redis_client: redis.Redis, basic_app) -> None:  # noqa: ANN001
    """The fetch script moves a message whose envelope is not kombu's to its queue's dead letters,
    except on a list a no-ack consumer reads (a reply queue): there it is dropped, as kombu would
    have popped it, and no dead-letter list or counter is made; the good reply behind it is
    fetched by the same call."""
    queue = "c0ffee.reply.celery.pidbox"
    with basic_app.app.connection_for_write() as connection:
        channel = consuming_channel(connection, queue, 1, no_ack=True)
        redis_client.rpush(queue, b"not json")  # at the tail: the next fetch meets it first
        dead, _, raw, _, _ = channel.client.execute_command(*channel._fetch_command([queue]))
        assert dead == 0 and json.loads(raw)["body"]
        assert redis_client.llen(queue) == 0
        assert not redis_client.exists(LAYOUT.dead_letters(queue), LAYOUT.dead_letter_count(queue))
        assert LAYOUT.held(redis_client) == []   # no-ack: popped, never held
        channel.close()


def test_dead_letter_requeue_puts_a_fixed_message_back_to_run(redis_client: redis.Redis, workers: Workers,
                                                              basic_app) -> None:  # noqa: ANN001
    """A real task message kept as a dead letter (here: planted) goes back on its queue with
    `requeue` and runs."""
    message = _envelope(json.dumps([[], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                            "chord": None}]).encode(), "tests.apps.basic.default_task")
    letter = letters.DeadLetter("planted", "cpu", time.time(), json.dumps(message).encode())
    letters.dead_letter(redis_client, LAYOUT, letter)
    assert dead_letters.requeue(redis_client, LAYOUT, "cpu") == 1
    workers.start("tests.apps.basic", "cpu", "rerunner", *ARGS)
    task_id = message["headers"]["id"]
    assert basic_app.app.AsyncResult(task_id).get(timeout=30)["worker"] == "rerunner@test"
    assert dead_letters.summary(redis_client, LAYOUT) == [dead_letters.QueueDeadLetters("cpu", 0, 1)]


def test_purging_a_dead_letter_that_is_not_there_names_the_number(redis_server: EmbeddedRedis,
                                                                  redis_client: redis.Redis) -> None:
    from sluice.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="no dead letter number 3"):
        dead_letters.purge(redis_client, LAYOUT, "cpu", 3)


def test_a_publish_adds_one_bell_token_and_the_next_fetch_trims_the_bell_to_its_cap(
        redis_client: redis.Redis, basic_app) -> None:  # noqa: ANN001
    """A publish pushes its queue's bell token without trimming (one command less per
    ``.delay()``): with nobody fetching, the bell holds one token per waiting message, past the
    cap. The transport's own fetch takes one message (held, not lost), spends a token and trims
    the bell to the cap."""
    from kombu import Producer, Queue

    from sluice import keys
    from sluice.queues.broker.bells import BELL_CAP

    queue, extra = "bell-test", 20
    with basic_app.app.connection_for_write() as connection:
        channel = connection.default_channel
        scripts.load(channel.client, "fetch")  # as the channel does on a fresh Redis
        producer = Producer(channel)
        for n in range(BELL_CAP + extra):
            producer.publish({"n": n}, routing_key=queue, declare=[Queue(queue)], serializer="json")
        assert redis_client.llen(keys.bell(queue)) == BELL_CAP + extra
        dead, number, raw, tag, _revoked = channel.client.execute_command(*channel._fetch_command([queue]))
    assert dead == 0 and number == 1 and json.loads(raw)["properties"]["delivery_tag"] == tag.decode()
    assert redis_client.llen(keys.bell(queue)) == BELL_CAP
    assert redis_client.llen(queue) == BELL_CAP + extra - 1 and redis_client.hexists(LAYOUT.unacked_key, tag)
