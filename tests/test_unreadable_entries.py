"""One entry sluice cannot read never stops anything else.

The fetch script refuses what sluice's readers would refuse after it (a message that is not
valid UTF-8 JSON) and dead-letters it with its reason; every reader of sluice's Redis
structures reads each entry on its own and skips, logs and counts the one it cannot read. Here:
a message with one invalid byte, held as a worker that took it before the fetch script refused
such messages would have left it, does not stop orphan recovery, ``sluice status`` or ``sluice
metrics``, and ends as a dead letter; and any bytes in one entry of each structure leave every
reader reading the others.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice import entries, keys
from sluice.cli import main
from sluice.cli import runs as runs_commands
from sluice.client.batch import recovery
from sluice.compute import Compute
from sluice.deploy.embedded import EmbeddedRedis, free_port
from sluice.deploy.metrics import ClassMetrics, TaskMetrics
from sluice.queues import dead_letters, status, task_catalog
from sluice.queues.broker.fetching import FetchCall
from sluice.queues.broker import letters, scripts
from sluice.queues.broker.layout import Held, RedisLayout, task_meta_key, task_states
from sluice.tasks import history, memory_profile
from sluice.tasks.heartbeat import WorkerBeat, read_heartbeats
from sluice.tasks.retry import AttemptRecord, Reason
from sluice.workers.reaper import OrphanReaper
from tests.conftest import ROOT, Workers, wait_for

LAYOUT = RedisLayout()
#: The orphan grace is long enough that the planted message is still held while the killed
#: worker's task is recovered (a claimed task is put back at once: its holder's heartbeat is gone):
#: the message's held time is renewed as the next worker starts, whose first sweep is 0.5 s later.
GRACE = 6.0
FAST_RECOVERY = {"SLUICE_HEARTBEAT_INTERVAL": "0.2", "SLUICE_REAPER_INTERVAL": "0.5", "SLUICE_ORPHAN_GRACE": str(GRACE)}
ARGS = ("--queue", "medium", "--queue", "large", "-c", "2", "--without-mingle", "--without-gossip")
#: From the new worker's heartbeat to the killed task running again: a reaper interval (0.5 s),
#: a fetch and an escalated re-publish take about a second; the rest is room for a loaded box.
RECOVERY_BOUND = 10.0


def _fetch(client: redis.Redis, queue: str, now: float) -> list[Any]:
    """One run of the transport's fetch script on ``queue`` (as a worker's channel runs it)."""
    return scripts.run(client, "fetch", *FetchCall.of(LAYOUT, [(queue, False, None)]).arguments(now, False, "", 0))


def _with_bad_byte(message: dict[str, Any]) -> bytes:
    """``message`` as kombu encodes it, with one ``\\xff`` byte in a header string (well-formed
    JSON that cjson accepts and Python's json.loads refuses)."""
    message["headers"]["argsrepr"] = "(\udcff)"  # the byte \xff, kept by surrogateescape
    return json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogateescape")


def _ladder_messages(ladder: ModuleType, client: redis.Redis, count: int) -> list[dict[str, Any]]:
    """Real task messages of the ladder app, as they wait on its queue (published, then taken off)."""
    for _ in range(count):
        ladder.long_step.delay(0.1)
    return [json.loads(client.rpop("small")) for _ in range(count)]


def _metrics(port: int) -> str | None:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return None


def test_a_held_message_that_is_not_utf8_leaves_recovery_status_and_metrics_working_and_ends_a_dead_letter(
        redis_client: redis.Redis, workers: Workers) -> None:
    """One message with an invalid byte pushed on the queue is dead-lettered by the fetch with
    its reason; another, held as a worker that took it before would have left it, stays while a
    worker running a task is SIGKILLed: the task runs again within seconds of the next worker
    starting, `sluice status` exits 0, `sluice metrics` answers with the held message it can
    read counted and the one it cannot counted apart, and once no one renews the unreadable one
    for the orphan grace it becomes a dead letter of its queue, bytes intact."""
    ladder = importlib.import_module("tests.apps.ladder")
    queued, held = (_with_bad_byte(message) for message in _ladder_messages(ladder, redis_client, 2))
    redis_client.lpush("small", queued)
    victim = workers.start("tests.apps.ladder", "small", "victim", *ARGS, env=FAST_RECOVERY)
    wait_for(lambda: redis_client.llen(LAYOUT.dead_letters("small")), 30, "the queued bad message to be dead-lettered")
    (_, letter), = dead_letters.read(redis_client, LAYOUT, "small")
    assert (letter.raw, letter.reason) == (queued, f"not valid UTF-8 (byte {queued.index(0xff)})")

    result = ladder.long_step.delay(3.0)
    wait_for(lambda: redis_client.exists(f"test:running:{result.id}:1"), 60, "the task to start")
    tag = str(uuid.uuid4())
    redis_client.hset(LAYOUT.unacked_key, tag, b"[" + held + b',"","small"]')   # as fetch.lua writes it
    redis_client.zadd(LAYOUT.unacked_index_key, {tag: time.time()})
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)

    env = {"SLUICE_BROKER_URL": os.environ["SLUICE_BROKER_URL"]}
    answer = CliRunner().invoke(main, ["status", "-A", "tests.apps.ladder"], env=env)
    assert answer.exit_code == 0 and "small" in answer.output, answer.output
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "sluice", "metrics", "-A", "tests.apps.ladder", "--port", str(port)],
                              cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        text = str(wait_for(lambda: server.poll() is not None or _metrics(port), 60, "sluice metrics to answer"))
        assert server.poll() is None, "sluice metrics exited"
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
    assert 'sluice_reserved{resource_class="small"} 1.0' in text, text        # the killed task's message
    assert 'sluice_unreadable_entries_total{kind="held message"}' in text, text

    assert redis_client.hexists(LAYOUT.unacked_key, tag), "the unreadable message is still held"
    redis_client.zadd(LAYOUT.unacked_index_key, {tag: time.time()})   # renewed, as its holder would have
    workers.start("tests.apps.ladder", "small", "heir", *ARGS, env=FAST_RECOVERY)
    wait_for(lambda: redis_client.exists(f"test:running:{result.id}:2"), RECOVERY_BOUND, "the killed task to run again")
    assert result.get(timeout=30)["attempt"] == 2
    wait_for(lambda: not redis_client.hexists(LAYOUT.unacked_key, tag), GRACE + 10,
             "the unreadable held message to become a dead letter")
    newest, _ = dead_letters.read(redis_client, LAYOUT, "small")
    assert newest[1].raw == held and newest[1].reason.startswith("unreadable while held (UnicodeDecodeError")
    assert int(redis_client.get(LAYOUT.dead_letter_count("small"))) == 2


# --- any bytes in one entry of each structure ---------------------------------------------------

#: Byte sequences Python's strict UTF-8 decoder refuses: a stray continuation byte, overlong
#: forms, a surrogate, past U+10FFFF, bytes UTF-8 never uses, truncated sequences.
INVALID_UTF8 = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x9f\xbf", b"\xed\xa0\x80", b"\xf0\x8f\xbf\xbf",
                b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xfe", b"\xff", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98"]
#: Their valid neighbours: the first and last of each form's range.
VALID_UTF8 = [b"\xc2\x80", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xee\x80\x80", b"\xef\xbf\xbf",
              b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", "é€😀".encode()]

#: One bad entry: any bytes, or a good entry of the structure with an invalid sequence put in at
#: some position (inside a string: well-formed JSON, the case cjson lets through).
BAD = st.one_of(st.binary(max_size=200).map(lambda noise: ("noise", noise)),
                st.tuples(st.integers(min_value=0), st.sampled_from(INVALID_UTF8)).map(lambda at: ("insert", at)))


def _bad(how: tuple[str, Any], good: bytes) -> bytes:
    kind, value = how
    if kind == "noise":
        return value
    position, sequence = value
    position %= len(good) + 1
    return good[:position] + sequence + good[position:]


def _unreadable(decode: Any, *entry: bytes) -> bool:
    try:
        decode(*entry)
    except entries.UNREADABLE:
        return True
    return False


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(inserted=st.one_of(st.binary(max_size=40), st.text(max_size=20).map(str.encode),
                          st.lists(st.sampled_from(INVALID_UTF8 + VALID_UTF8 + [b"a"]), max_size=6).map(b"".join)))
def test_the_fetch_script_holds_exactly_the_messages_sluices_readers_can_read(redis_server: EmbeddedRedis,
                                                                               inserted: bytes) -> None:
    """Any bytes in a header string of a well-formed message (quotes, backslashes and control
    characters left out: both decoders refuse those as JSON): the fetch script holds it exactly
    when sluice's readers can read it (strict UTF-8: json.loads on bytes refuses the same, but
    lets encoded surrogates pass), and otherwise dead-letters it naming the first bad byte where
    Python's decoder names it."""
    client = redis_server.client()
    client.flushdb()
    inserted = bytes(b for b in inserted if b >= 0x20 and b not in b'"\\')
    raw = (b'{"body":"W10=","headers":{"id":"t","argsrepr":"' + inserted + b'"},"properties":{"delivery_tag":"d",'
           b'"delivery_info":{"exchange":"","routing_key":"q"}}}')
    client.lpush("q", raw)
    reply = _fetch(client, "q", time.time())
    try:
        entries.loads(raw)
    except UnicodeDecodeError as exc:
        assert reply == [1]
        (_, letter), = dead_letters.read(client, LAYOUT, "q")
        assert (letter.raw, letter.reason) == (raw, f"not valid UTF-8 (byte {exc.start})")
    else:
        assert reply == [0, 1, raw, b"d", 0]   # taken, held, not revoked
        assert Held.decode(b"d", client.hget(LAYOUT.unacked_key, "d")).message == json.loads(raw)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=BAD)
def test_every_reader_of_sluices_redis_structures_reads_the_rest_past_one_bad_entry(
        redis_server: EmbeddedRedis, how: tuple[str, Any]) -> None:
    """Each structure sluice reads in bulk gets good entries written by sluice's own writers and
    one bad entry: held messages, a queue, a dead worker's own queue and the binding table naming
    it, heartbeats, the task catalog, a memory profile and the profiles' index, an attempt
    history, dead letters (list, key name, counter), forward counts and class counters, a task
    result, a batch run's key. Every reader returns the good entries; the reaper still restores
    the orphan and rehomes the sticky message, and the bad held message leaves the unacked hash
    (as a dead letter when it does not read)."""
    basic = importlib.import_module("tests.apps.basic")
    app, client = basic.app, redis_server.client()
    client.flushdb()
    old = time.time() - 3600

    direct = "dead@host.dq2"                                  # a dead worker's own queue, with a sticky retry
    sticky = basic.default_task.delay()
    message = json.loads(client.rpop("cpu"))
    message["headers"]["sluice_sticky"] = "cpu"
    client.lpush(direct, json.dumps(message), _bad(how, json.dumps(message).encode()))
    member = f"{direct}{LAYOUT.sep}{LAYOUT.sep}{direct}".encode()
    client.sadd("_kombu.binding.C.dq2", member, _bad(how, member))

    orphan = basic.default_task.delay()                      # held by a worker that died an hour ago
    _fetch(client, "cpu", old)
    (orphan_tag, held_entry), = client.hgetall(LAYOUT.unacked_key).items()
    bad_tag = b"bad-" + orphan_tag
    bad_held = _bad(how, held_entry)
    client.hset(LAYOUT.unacked_key, bad_tag, bad_held)
    client.zadd(LAYOUT.unacked_index_key, {bad_tag: old})
    waiting = basic.default_task.delay()
    waiting_raw = client.lindex("cpu", 0)
    client.lpush("cpu", _bad(how, waiting_raw))

    beat = WorkerBeat(hostname="good@host", classes=("cpu",), queues=("cpu",), slots=2).encode().encode()
    client.set(keys.worker_heartbeat("good@host"), beat)
    client.set(keys.worker_heartbeat("bad@host"), _bad(how, beat))
    entry = task_catalog.TaskEntry("good.task", None, Compute(memory="1Gi"), None, "w", 0.0)
    task_catalog.publish(client, [entry])
    client.hset(keys.TASK_CATALOG, b"x" + _bad(how, b"good.task"), _bad(how, entry.encode().encode()))
    pipe = client.pipeline()
    for _ in range(3):
        memory_profile.observe(pipe, "good.task", 100 << 20)
    pipe.execute()
    client.hset(keys.memory_profile("good.task"), b"x" + _bad(how, b"b10"), _bad(how, b"3"))
    client.zadd(keys.MEMORY_PEAKS, {b"x" + _bad(how, b"good.task"): 1})
    record = AttemptRecord(1, "cpu", Compute(memory="1Gi"), Reason.WORKER_LOST, "died", "good@host")
    history.append(client, "good-id", record)
    client.rpush(keys.attempts("good-id"), _bad(how, json.dumps(record.encode()).encode()))

    letter = letters.DeadLetter("planted", "cpu", time.time(), waiting_raw)
    letters.dead_letter(client, LAYOUT, letter)
    client.lpush(LAYOUT.dead_letters("cpu"), _bad(how, letter.encode()))
    client.lpush(LAYOUT.dead_letters("x").encode() + _bad(how, b"cpu"), b"x")
    client.set(LAYOUT.dead_letter_count("spare"), _bad(how, b"1"))
    client.hincrby(keys.FORWARDED, "small big", 2)
    client.hset(keys.FORWARDED, b"x" + _bad(how, b"small big"), _bad(how, b"2"))
    client.set(keys.stat("escalations", "cpu"), _bad(how, b"5"))
    app.backend.store_result("good-result", 1, "SUCCESS")
    client.set(task_meta_key(app, "bad-result"), _bad(how, client.get(task_meta_key(app, "good-result"))))
    client.hset(keys.run("goodrun", "source"), "filename", "t.py")
    client.hset(keys.run("goodrun", "source").encode().replace(b"goodrun", _bad(how, b"badrun")), "filename", "t.py")

    assert orphan.id in {item.task_id for item in LAYOUT.held(client)}
    assert LAYOUT.held_by_queue(client)["cpu"] >= 1
    assert waiting.id in LAYOUT.waiting_task_ids(client, "cpu")
    assert direct in LAYOUT.bound_queues(client, "C.dq2")
    assert "good@host" in {b.hostname for b in read_heartbeats(client)}
    row, = [r for r in status.class_status(client, app.catalog) if r.resource_class.name == "cpu"]
    assert row.reserved >= 1 and row.queued >= 2 and row.workers >= 1
    assert status.demand(app, client, "cpu")[1] > 0
    assert replace(task_catalog.read(client)["good.task"], at=0.0) == entry
    assert memory_profile.read(client, "good.task").count >= 3
    assert "good.task" in memory_profile.observed_tasks(client)
    assert record in history.read(client, "good-id")
    assert (1, letter) in dead_letters.read(client, LAYOUT, "cpu")
    assert "cpu" in {r.queue for r in dead_letters.summary(client, LAYOUT)}
    samples = {(s.name, tuple(s.labels.values())): s.value
               for m in (*ClassMetrics(client, app.catalog).collect(), *TaskMetrics(client, app.catalog, app.settings).collect())
               for s in m.samples}
    assert samples[("sluice_forwarded_total", ("small", "big"))] == 2
    assert samples[("sluice_reserved", ("cpu",))] >= 1
    assert samples[("sluice_task_runs_observed_total", ("good.task",))] >= 3
    assert task_states(app, ["good-result", "bad-result"])[0] == "SUCCESS"
    assert "goodrun" in runs_commands._on_broker(client)
    lost = recovery.LostChunks(client, LAYOUT, "cpu", every=0)
    assert [lost.lost({orphan.id, waiting.id, "gone"}) for _ in range(2)] == [set(), {"gone"}]
    inherited = recovery.LostInherited(client, LAYOUT, "cpu", "a-run", every=0)
    assert [inherited.gone() for _ in range(2)] == [False, True]

    swept = OrphanReaper(app, client, "sweeper", interval=0.5, grace=60).sweep_once()
    assert orphan.id in swept and sticky.id in swept
    assert not client.hexists(LAYOUT.unacked_key, bad_tag), "the bad held message was left held"
    if _unreadable(Held.decode, bad_tag, bad_held):
        reasons = [dead.reason for row in dead_letters.summary(client, LAYOUT)
                   for _, dead in dead_letters.read(client, LAYOUT, row.queue, 0, 100)]
        assert any(reason.startswith("unreadable while held") for reason in reasons), reasons
    assert dead_letters.requeue(client, LAYOUT, "cpu") >= 1


def test_a_batch_record_that_does_not_decode_ends_as_a_lost_item_not_a_run_that_never_ends(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    """A chunk ended (its state SUCCESS) whose records reached the driver's ready list, one of
    them bytes that do not decode: the driver sinks the readable record, skips the other, and
    once the chunk has stayed ended with that item awaited past ``ended_grace``, records the item
    lost (what ``--resume`` runs again) instead of awaiting it forever."""
    from sluice import App
    from sluice.client.batch.driver import Driver
    from sluice.client.batch.progress import RunSettings
    from sluice.client.batch.sink import Sink
    from sluice.tasks.batch.records import LOST, Failure, Ready, encode
    from sluice.tasks.batch.taskfile import TaskFile

    app = App("tests.unreadable.batch")
    task_file = TaskFile.from_source("t.py", "def plan():\n    yield {'id': 'a'}\n\ndef execute(item):\n    return {}\n", [])
    sunk: list[Any] = []
    driver = Driver(app, task_file, Sink(tmp_path / "sink").open(), RunSettings("unreadable-run", "cpu"), 1,
                    on_record=sunk.append)
    driver.ended_grace = 0.5
    driver.chunks["chunk-1"] = ["good", "bad"]
    driver.waiting.update(["good", "bad"])
    app.backend.store_result("chunk-1", 2, "SUCCESS")
    redis_client.rpush(driver.key("ready"), encode(Ready("good", {"ok": True}, "w@test", 1, time.time(), 0.01)),
                       b'{"id": "bad", "status": "\xff')
    deadline = time.monotonic() + 10
    while driver.waiting and time.monotonic() < deadline:
        driver.collect(block=True)
        driver._poll_chunks()
    assert not driver.waiting, "the driver still awaits an item whose record will never come"
    lost = [r for r in sunk if isinstance(r, Failure)]
    assert [r.id for r in sunk if isinstance(r, Ready)] == ["good"]
    assert [(r.id, r.status, r.chunk) for r in lost] == [("bad", LOST, "chunk-1")], sunk
    assert "--resume runs it again" in lost[0].message


def test_a_held_entry_that_reads_as_nothing_is_kept_as_a_dead_letter_that_requeue_refuses_to_lose(
        redis_client: redis.Redis) -> None:
    """A held entry that is not even kombu's [message, exchange, queue] is kept as a dead letter of
    the unacked hash's name. Requeueing it would push to that hash (WRONGTYPE after the letter was
    already taken off its list: the letter lost); instead requeue refuses, and the letter stays."""
    from sluice.errors import ConfigurationError
    from sluice.queues.broker.letters import dead_letter_held

    tag, entry = b"tag-nothing", b"\xff not json"
    redis_client.hset(LAYOUT.unacked_key, tag, entry)
    assert dead_letter_held(redis_client, LAYOUT, tag, entry, "not JSON")
    assert redis_client.llen(LAYOUT.dead_letters(LAYOUT.unacked_key)) == 1
    with pytest.raises(ConfigurationError, match="not requeued"):
        dead_letters.requeue(redis_client, LAYOUT, LAYOUT.unacked_key)
    assert redis_client.llen(LAYOUT.dead_letters(LAYOUT.unacked_key)) == 1
    (_, letter), = dead_letters.read(redis_client, LAYOUT, LAYOUT.unacked_key)
    assert letter.raw == entry


def test_a_held_message_whose_claim_does_not_decode_leaves_the_sweep_restoring_the_others(
        redis_client: redis.Redis) -> None:
    """Two messages held by a worker gone an hour; one's ledger claim is bytes that do not decode.
    The sweep leaves that one held (its claim cannot be judged) and still restores the other,
    instead of failing the whole sweep on every tick."""
    basic = importlib.import_module("tests.apps.basic")
    old = time.time() - 3600
    first, second = basic.default_task.delay(), basic.default_task.delay()
    _fetch(redis_client, "cpu", old)
    _fetch(redis_client, "cpu", old)
    assert redis_client.hlen(LAYOUT.unacked_key) == 2
    redis_client.set(keys.delivery(first.id), b"\xff not a claim")
    swept = OrphanReaper(basic.app, redis_client, "sweeper", interval=0.5, grace=60).sweep_once()
    assert second.id in swept and first.id not in swept
    assert redis_client.hlen(LAYOUT.unacked_key) == 1
