"""The layout's promises: the core loads no capability, options and settings are checked when
declared, every wire format is written by one encoder, and no module grows past 400 lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.compute import Compute
from sluice.config import Settings
from sluice.errors import ConfigurationError
from sluice.headers import Headers
from sluice.tasks.batch.records import ID_PREFIX, Failure, Ready, decode, encode
from sluice.tasks.heartbeat import WorkerBeat
from sluice.tasks.memory_kill import MemoryKill
from sluice.tasks.remote.call import Call, Reply
from sluice.tasks.remote.session import SessionCall, SessionReply
from sluice.tasks.remote.settings import RemoteSettings
from sluice.tasks.retry import AttemptRecord, Reason, RetryOn, RetryPolicy

SRC = Path(__file__).resolve().parent.parent / "src" / "sluice"


@pytest.mark.parametrize("module", ["sluice.compute", "sluice.units", "sluice.errors"])
def test_core_modules_load_no_celery_worker_and_no_capability(module: str) -> None:
    """A fresh interpreter importing a core module loads no ``celery.worker`` module and no
    module of a capability (client/, workers/, assets/): the core imports none of them."""
    probe = (f"import sys, json; import {module}; "
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('celery', 'sluice')))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                       check=True, timeout=60).stdout)
    assert not [m for m in loaded if m.startswith("celery.worker")], loaded
    capability = ("sluice.client", "sluice.workers", "sluice.assets")
    assert not [m for m in loaded if m.startswith(capability)], loaded
    assert module in loaded


def test_unknown_task_option_is_rejected_at_declaration_naming_it_and_the_accepted_ones() -> None:
    """``@app.task(compue=...)`` (a typo of compute) fails when declared, not silently routed to cpu."""
    from sluice import App

    app = App("t", broker="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigurationError, match=r"unknown task option 'compue'.*compute, retry.*time_limit"):
        @app.task(compue=Compute(memory="32Gi"))
        def join() -> None: ...
    with pytest.raises(ConfigurationError, match=r"unknown task option 'acks_lat'"):
        @app.task(acks_lat=True)
        def late() -> None: ...

    @app.task(time_limit=5, acks_late=True, compute=Compute(memory="1Gi"))
    def fine() -> None: ...

    assert fine.compute == Compute(memory="1Gi")


def test_a_capability_declares_the_task_options_it_adds() -> None:
    """``result_args`` is the batch capability's option, not the core's: an app with batch runs
    accepts it (and names it among sluice's options), an app without them refuses it."""
    from sluice import App
    from sluice.workers.batch import BATCH

    assert "result_args" in BATCH.accepted_task_options
    with_batch = App("with_batch", broker="redis://127.0.0.1:1/0", capabilities=[BATCH])

    @with_batch.task(result_args=False)
    def bulky(items: list[int]) -> None: ...

    assert bulky.result_args is False
    with pytest.raises(ConfigurationError, match=r"unknown task option 'compue'; sluice accepts compute, retry, "
                                                 r"unique, max_running, result_args and Celery's own"):
        with_batch.task(compue=Compute(memory="1Gi"))
    bare = App("bare_options", broker="redis://127.0.0.1:1/0", capabilities=[])
    with pytest.raises(ConfigurationError, match=r"unknown task option 'result_args'; sluice accepts compute, retry, "
                                                 r"unique, max_running and Celery's own"):
        bare.task(result_args=False)


def test_unknown_remote_class_is_rejected_when_settings_load(tmp_path: Path) -> None:
    """A ``remote_classes`` naming a class that does not exist fails at load, naming it and the classes."""
    with pytest.raises(ConfigurationError, match=r"remote_classes names 'hghmem', which is not a class; "
                                                 r"classes: cpu, highmem, gpu"):
        Settings.load(cwd=tmp_path, env={"SLUICE_REMOTE_CLASSES": "cpu,hghmem"})
    loaded = Settings.load(cwd=tmp_path, env={"SLUICE_REMOTE_CLASSES": "cpu,highmem"})
    assert loaded.section(RemoteSettings).remote_classes == ("cpu", "highmem")


def test_an_app_can_be_built_with_a_subset_of_capabilities() -> None:
    """``App(capabilities=[])`` has none of the capabilities' tasks; the default has all of them."""
    from sluice import App, default_capabilities

    bare = App("bare", broker="redis://127.0.0.1:1/0", capabilities=[])
    assert not [name for name in bare.tasks if name.startswith("sluice.")]
    full = App("full", broker="redis://127.0.0.1:1/0")
    expected = {name for capability in default_capabilities() for name in capability.tasks}
    assert expected == {"sluice.compute.run_chunk", "sluice.remote.call", "sluice.remote.session",
                        "sluice.assets.run_step"}
    assert expected <= set(full.tasks)


def test_headers_round_trip_and_default_attempt() -> None:
    """Every sluice header is written by Headers.encode and read back by Headers.read, from a
    mapping or from a request's attributes; an absent attempt is attempt 1."""
    policy = RetryPolicy(max_retries=2, retry_on=RetryOn.OOM)
    sent = Headers(3, Compute(memory="2Gi"), policy, "cpu", 1 << 30, "killed")
    wire = json.loads(json.dumps(sent.encode()))
    assert Headers.read(wire) == Headers(3, Compute(memory="2Gi").inherit(Compute()), policy, "cpu", 1 << 30, "killed")

    class Request:
        pass

    request = Request()
    vars(request).update(wire)
    assert Headers.read(request).attempt == 3
    assert Headers.read({}) == Headers() and Headers().encode() == {}


def test_heartbeat_round_trip_keeps_capability_fields_apart() -> None:
    """WorkerBeat encodes core and capability fields flat and decodes them back apart; a
    capability may not reuse a core field's name."""
    beat = WorkerBeat("cpu@h", "i1", 7, ("cpu",), ("cpu",), 4, ("t1",), 12.5, {"remote": True, "envs": ["k"]})
    assert WorkerBeat.decode(beat.encode()) == beat
    with pytest.raises(ValueError, match="slots"):
        WorkerBeat("cpu@h", extra={"slots": 1}).encode()


def test_batch_records_put_the_id_first_and_round_trip() -> None:
    """Every record line starts with ID_PREFIX and the id (what resume's fast path slices), and
    decode(encode(r)) == r for successes, failures and cancellations, key order notwithstanding."""
    records = [Ready("a", {"x": [1, 2]}, "w@h", 1, 1.5, 0.25),
               Failure("b", "failed", "ValueError", "bad", "tb", "w@h", 2),
               Failure.cancelled("c"), Failure.of_chunk("d", RuntimeError("lost"), "chunk-1")]
    for record in records:
        line = encode(record)
        assert line.startswith(f'{ID_PREFIX}{record.id}"') and decode(line) == record
    reordered = json.dumps({"worker": "w@h", "seconds": 0.25, "started": 1.5, "attempts": 1, "result": {"x": [1, 2]},
                            "id": "a"})
    assert decode(reordered) == records[0]
    with pytest.raises(TypeError):
        encode(Ready("e", object(), None, 1, 0.0, 0.0))  # a result JSON cannot hold fails the item


def test_no_module_is_over_400_lines() -> None:
    """The house rule: a file past ~400 lines is two files."""
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long


def test_memory_kill_record_round_trips_and_says_why() -> None:
    """The watchdog's record decodes to what was encoded; its stored message names the sizes."""
    kill = MemoryKill("t-1", "etl.join", 300 << 20, 200 << 20, "cpu", "w@h", 42, 1.5)
    wire = json.loads(kill.encode())
    assert wire["limit"] == 200 << 20 and "killed for memory" in wire["message"]
    assert MemoryKill.decode(kill.encode()) == kill
    with pytest.raises(TypeError):
        MemoryKill.decode("[]")


def test_attempt_record_round_trips_through_json() -> None:
    """An attempt record is what callers read after JSON (AttemptFailed.history, sluice.attempts())."""
    record = AttemptRecord(2, "highmem", Compute(memory="16Gi"), Reason.WORKER_LOST, "died", "w@h")
    wire = json.loads(json.dumps(record.encode()))
    assert wire == {"attempt": 2, "queue": "highmem", "compute": {"memory": "16Gi"}, "reason": "worker lost",
                    "detail": "died", "worker": "w@h"}
    assert AttemptRecord.decode(wire) == record
    missing_queue = {k: v for k, v in wire.items() if k != "queue"}
    for bad in ([], {**wire, "attempt": True}, {**wire, "reason": "bored"}, missing_queue):
        with pytest.raises((TypeError, ValueError, KeyError)):
            AttemptRecord.decode(bad)


def test_remote_messages_round_trip_through_json() -> None:
    """A call, its reply and a session's messages decode to what was encoded, after JSON."""
    call = Call("m.f", "3.11", ("numpy",), 1 << 30, b"\x80pickled", ("numpy",), 2 << 30, True, 1 << 30, None, True)
    opening = Call("session s1", "3.11", (), 1 << 30, b"", session="s1", lease=10.0)
    messages = [call, opening, Reply(b"\x80value", ["line"], [1 << 30, 2 << 30], 2, "w@h")]
    for message in messages:
        assert type(message).decode(json.loads(json.dumps(message.encode()))) == message
    assert "session" not in call.encode() and call.encode()["protocol"] == 1
    in_session = [SessionCall("s1", 3, b"\x80call"), SessionCall("s1", close=True),
                  SessionReply("s1", 3, "w@h", ["out"], [1 << 30], payload=b"\x80value"),
                  SessionReply("s1", 4, "w@h", [], [1 << 30], error="the sandbox died", memory=True)]
    for sent in in_session:
        assert type(sent).decode(json.loads(json.dumps(sent.encode())), "s1") == sent


def test_a_session_message_signed_for_another_session_is_refused() -> None:
    """A signed call or reply copied into another session's list names the session it was signed
    for: decoding it for this session refuses it before anything is unpickled."""
    from sluice.errors import InvalidRequestError

    for sent in (SessionCall("s1", 3, b"\x80call"), SessionReply("s1", 3, "w@h", [], [], payload=b"\x80v")):
        with pytest.raises(InvalidRequestError, match="signed for session 's1'"):
            type(sent).decode(json.loads(json.dumps(sent.encode())), "s2")
