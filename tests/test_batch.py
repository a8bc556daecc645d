"""`sluice compute`: the reference example in every mode, and the sink's guarantees under failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sluice.client.batch.sink import repair_torn_tail
from tests.conftest import ROOT, wait_for
from tests.processes import driver_workers

pytestmark = pytest.mark.integration
EXAMPLE = ROOT / "examples" / "task.py"
COUNTING = ROOT / "tests" / "tasks" / "counting.py"


def compute(*args: str, home: Path, timeout: float = 100, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice", "compute", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=_env(home) | env)


def _env(home: Path) -> dict[str, str]:
    """The run's own embedded Redis (no broker), and lost chunks looked for every second, not
    every 10 s: the resume tests wait through two such checks."""
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_BROKER_URL"}
    return env | {"SLUICE_HOME": str(home), "PYTHONPATH": str(ROOT), "SLUICE_LOST_CHECK_INTERVAL": "1"}


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_plain_script_and_check(tmp_path: Path) -> None:
    plain = subprocess.run([sys.executable, str(EXAMPLE), "--n", "2"], capture_output=True, text=True, timeout=30)
    assert plain.stdout.splitlines() == ["{'x2': 0}", "{'x2': 2}"]
    check = compute(str(EXAMPLE), "--check", "--", "--n", "2", home=tmp_path)
    assert check.returncode == 0, check.stderr
    records = [json.loads(line) for line in check.stdout.splitlines()]
    assert [(r["id"], r["result"], r["worker"], r["attempts"]) for r in records] == [
        ("t-0", {"x2": 0}, "check", 1), ("t-1", {"x2": 2}, "check", 1)]


def test_check_fails_a_result_the_run_cannot_encode(tmp_path: Path) -> None:
    """--check encodes each result exactly as a real run does: a set (which JSON cannot hold)
    is a failed item and exit 1 under --check, not a string and exit 0."""
    task = tmp_path / "sets.py"
    task.write_text("def plan():\n    yield {'id': 'a'}\n\ndef execute(item):\n    return {1, 2}\n")
    check = compute(str(task), "--check", home=tmp_path)
    assert check.returncode == 1, check.stdout
    record = json.loads(check.stdout)
    assert (record["id"], record["status"], record["error"]) == ("a", "failed", "TypeError")
    assert "not JSON serializable" in record["message"] and "not JSON serializable" in check.stderr


@pytest.mark.parametrize("workers", [["-w", "4"], ["-w", "1", "--per-worker", "4"]], ids=["w4", "w1x4"])
def test_reference_example_on_local_workers(tmp_path: Path, workers: list[str]) -> None:
    result = compute(str(EXAMPLE), *workers, "--results", "ndjson", "--", "--n", "100", home=tmp_path)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(r["id"] for r in records) == sorted(f"t-{i}" for i in range(100))
    assert all(r["result"] == {"x2": int(r["id"][2:]) * 2} for r in records)


def test_sink_resume_and_observe(tmp_path: Path) -> None:
    sink = tmp_path / "run1"
    first = compute(str(EXAMPLE), "-w", "2", "--sink", str(sink), "--", "--n", "300", home=tmp_path)
    assert first.returncode == 0, first.stderr
    ready = lines(sink / "ready.ndjson")
    assert len(ready) == 300 and len({r["id"] for r in ready}) == 300
    assert set(ready[0]) == {"id", "result", "worker", "attempts", "started", "seconds"}
    checkpoint = json.loads((sink / "checkpoint.json").read_text())
    assert checkpoint["ok"] == 300 and checkpoint["plan_done"] and sum(checkpoint["per_worker"].values()) == 300
    again = compute(str(EXAMPLE), "-w", "2", "--sink", str(sink), "--resume", "--observe", "--", "--n", "400",
                    home=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "done=100 failed=0" in again.stderr         # plain progress lines: stderr is not a terminal
    assert "in_flight=" in again.stderr and "running=" not in again.stderr   # queued items are not "running"
    assert "300 skipped" in again.stderr
    assert len({r["id"] for r in lines(sink / "ready.ndjson")}) == 400 == len(lines(sink / "ready.ndjson"))
    refused = compute(str(EXAMPLE), "-w", "1", "--sink", str(sink), "--", "--n", "1", home=tmp_path)
    assert refused.returncode == 2 and "--resume" in refused.stderr


def test_traj_writes_every_success_once_as_a_lance_dataset_and_resume_rebuilds_it(tmp_path: Path) -> None:
    """--traj writes each success once; its closing line names the dataset on one line even when
    piped with a path longer than 80 columns (a folded path is one a user cannot copy or grep)."""
    import lance

    sink = tmp_path / ("a-sink-directory-with-a-long-name-" * 3) / "run"
    env = {k: v for k, v in _env(tmp_path).items() if k != "COLUMNS"}
    first = subprocess.run([sys.executable, "-m", "sluice", "compute", str(EXAMPLE), "-w", "2", "--sink", str(sink),
                            "--traj", "--", "--n", "120"], capture_output=True, text=True, timeout=100, cwd=ROOT,
                           env=env)
    assert first.returncode == 0, first.stderr
    assert f"wrote Lance dataset {sink / 'results.lance'} (120 rows)\n" in first.stderr.splitlines(keepends=True)
    again = compute(str(EXAMPLE), "-w", "2", "--sink", str(sink), "--resume", "--traj", "--", "--n", "150",
                    home=tmp_path)
    assert again.returncode == 0, again.stderr
    table = lance.dataset(str(sink / "results.lance")).to_table()
    assert table.schema.names == ["id", "worker", "attempts", "started", "seconds", "result"]
    rows = table.to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(f"t-{i}" for i in range(150))          # once each
    assert all(json.loads(r["result"]) == {"x2": int(r["id"][2:]) * 2} and r["attempts"] == 1 for r in rows)
    assert {r["id"] for r in rows} == {r["id"] for r in lines(sink / "ready.ndjson")}


def test_a_worker_that_keeps_failing_is_quarantined(tmp_path: Path) -> None:
    """w1 dies on every item it takes: it is quarantined (w0, healthy, never is), the items its
    dead chunks held end as lost, and resume runs them; counted where they run, no item's body
    completed twice (w1 completes none; a chunk sent twice would show here, not in the sink)."""
    sink, done = tmp_path / "run", tmp_path / "done"
    done.mkdir()
    result = compute(str(ROOT / "tests" / "tasks" / "where.py"), "-w", "2", "--retries", "2", "--quarantine-after",
                     "2", "--sink", str(sink), "--observe", "--", "--n", "80", "--die-on", "w1.", "--done", str(done),
                     home=tmp_path)
    assert result.returncode == 1, result.stderr          # some items failed (those w1 took before quarantine)
    checkpoint = json.loads((sink / "checkpoint.json").read_text())
    assert len(checkpoint["quarantined"]) == 1 and checkpoint["quarantined"][0].startswith("w1.")
    assert "quarantined" in result.stderr and checkpoint["quarantined"][0] in result.stderr
    ready, failed = lines(sink / "ready.ndjson"), lines(sink / "failures.ndjson")
    ids = [r["id"] for r in ready + failed]
    assert sorted(ids) == sorted(f"t-{i}" for i in range(80))               # every id exactly once
    assert all(r["worker"].startswith("w0.") for r in ready) and len(ready) > len(failed)
    # their chunks died with their worker process, retries spent: lost to infrastructure, which
    # resume runs again (a business failure is "failed" and is skipped)
    assert failed and all(r["status"] == "lost" and r["chunk"] for r in failed)
    resumed = compute(str(ROOT / "tests" / "tasks" / "where.py"), "-w", "1", "--sink", str(sink), "--resume",
                      "--", "--n", "80", "--done", str(done), home=tmp_path)
    assert resumed.returncode == 0, resumed.stderr                          # the lost items ran again
    assert sorted(r["id"] for r in lines(sink / "ready.ndjson")) == sorted(f"t-{i}" for i in range(80))
    assert lines(sink / "failures.ndjson") == []                            # and no stale record is left
    completions = Counter(i for path in done.iterdir() for i in path.read_text().split())
    assert sorted(completions) == sorted(f"t-{i}" for i in range(80))
    assert [i for i, n in completions.items() if n > 1] == [], "an item's body completed twice"


def test_failures_duplicates_and_missing_ids(tmp_path: Path) -> None:
    sink = tmp_path / "run"
    result = compute(str(COUNTING), "-w", "2", "--sink", str(sink), "--", "--n", "50", "--fail-every", "10",
                     "--dup-every", "7", home=tmp_path)
    assert result.returncode == 1, result.stderr                      # some failed
    ready, failures = lines(sink / "ready.ndjson"), lines(sink / "failures.ndjson")
    assert sorted(f["id"] for f in failures) == [f"item-{i}" for i in (10, 20, 30, 40)]
    assert {f["status"] for f in failures} == {"failed"} and "ValueError: item 10" in failures[0]["traceback"]
    ids = [r["id"] for r in ready] + [f["id"] for f in failures]
    assert len(ids) == len(set(ids)) == 51                            # 50 + the one given a UUID
    assert "8 duplicate ids" in result.stderr                         # 0, 7, ..., 49: each reported once
    marks = tmp_path / "marks"
    marks.mkdir()
    rerun = compute(str(COUNTING), "-w", "1", "--sink", str(sink), "--resume", "--rerun-failed", "--", "--n", "50",
                    "--fail-every", "10", "--marks", str(marks), home=tmp_path)
    ran = sorted(line for f in marks.iterdir() for line in f.read_text().split() if line.startswith("item-"))
    assert ran == [f"item-{i}" for i in (10, 20, 30, 40)]             # only the failures ran again
    assert "1 ok, 4 failed" in rerun.stderr                          # (and the id-less item: a new UUID each plan)
    failures = lines(sink / "failures.ndjson")                        # compacted: the latest record per id
    assert sorted(f["id"] for f in failures) == [f"item-{i}" for i in (10, 20, 30, 40)]


def test_sys_exit_and_nan_fail_their_item_alone_named(tmp_path: Path) -> None:
    """sys.exit(3) in execute() (a BaseException) fails that item only, naming it, and a NaN in a
    result fails that item naming the field; every other item of the same chunk succeeds."""
    sink = tmp_path / "run"
    result = compute(str(COUNTING), "-w", "1", "--sink", str(sink), "--", "--n", "30", "--exit-on", "7",
                     "--nan-on", "12", home=tmp_path)
    assert result.returncode == 1, result.stderr
    failures = {f["id"]: f for f in lines(sink / "failures.ndjson")}
    assert sorted(failures) == ["item-12", "item-7"]
    assert failures["item-7"]["error"] == "SystemExit" and "item 'item-7'" in failures["item-7"]["message"]
    assert failures["item-12"]["error"] == "ValueError"
    assert "result['stats']['loss'][1] is nan" in failures["item-12"]["message"]
    assert len(lines(sink / "ready.ndjson")) == 29            # 30 + the id-less one, less the two
    assert all(f["status"] == "failed" for f in failures.values())


def test_torn_trailing_line_is_repaired(tmp_path: Path) -> None:
    path = tmp_path / "ready.ndjson"
    path.write_text('{"id": "a", "result": 1}\n{"id": "b", "res')
    assert repair_torn_tail(path)
    assert path.read_text() == '{"id": "a", "result": 1}\n'
    path.write_text('{"id": "a", "result": 1}\n{"id": "b", "result"\n')
    assert repair_torn_tail(path) and path.read_text() == '{"id": "a", "result": 1}\n'
    assert not repair_torn_tail(path)


def test_ctrl_c_records_cancelled_and_resume_runs_them(tmp_path: Path) -> None:
    sink = tmp_path / "run"
    args = [str(COUNTING), "-w", "2", "--sink", str(sink), "--", "--n", "40", "--sleep", "0.2"]
    driver = subprocess.Popen([sys.executable, "-m", "sluice", "compute", *args], cwd=ROOT, env=_env(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(lines(sink / "ready.ndjson")) >= 4, 60, "a few results")
    driver.send_signal(signal.SIGINT)
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 130, err
    ready, failures = lines(sink / "ready.ndjson"), lines(sink / "failures.ndjson")
    assert {f["status"] for f in failures} == {"cancelled"} and failures
    assert not {r["id"] for r in ready} & {f["id"] for f in failures}
    resumed = compute(*args[:5], "--resume", "--", "--n", "40", home=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert len({r["id"] for r in lines(sink / "ready.ndjson")}) == 41 == len(lines(sink / "ready.ndjson"))
    # every cancelled named id has succeeded since, so none is left; the id-less item gets a new
    # UUID from each plan(), so its old cancelled record names an id no plan yields any more
    assert [f["id"] for f in lines(sink / "failures.ndjson") if f["id"].startswith("item-")] == []


def test_kill_workers_ten_times_every_id_runs_and_only_a_killed_process_causes_a_rerun(tmp_path: Path) -> None:
    """Ten whole-worker SIGKILLs (every process of the worker) during a 2,001-item run: counted at
    the source (each execute() appends its id to its process's file), every id ran and succeeded,
    the sink holds each once, and an id ran more than once only where one of its runs was in a
    killed process (the at-least-once window the README names); two runs by surviving processes
    would be a task run twice by accident. Items 1,500 and up wait for a gate opened after the
    tenth kill, so the kills happen however fast the machine."""
    sink, marks, gate = tmp_path / "run", tmp_path / "marks", tmp_path / "gate"
    marks.mkdir()
    driver = subprocess.Popen([sys.executable, "-m", "sluice", "compute", str(COUNTING), "-w", "2", "--per-worker", "2",
                               "--retries", "5", "--sink", str(sink), "--", "--n", "2000", "--sleep", "0.005",
                               "--marks", str(marks), "--gate", str(gate), "--gate-from", "1500"],
                              cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed: set[int] = set()

    def both_up(kill: int) -> list[Any]:
        """The two workers, once 100 more results are in; a worker just killed (maybe not yet a
        zombie) is not one of them."""
        up = [w for w in driver_workers(driver) if w.pid not in killed]
        return up if len(up) == 2 and len(lines(sink / "ready.ndjson")) > 100 * (kill + 1) else []

    for kill in range(10):
        up = wait_for(lambda k=kill: both_up(k), 60, f"100 more results and both workers up before kill {kill + 1}")
        victim = up[kill % 2]
        killed |= {victim.pid, *(child.pid for child in victim.children(recursive=True))}
        os.killpg(victim.pid, signal.SIGKILL)
    gate.touch()
    _, err = driver.communicate(timeout=100)
    assert driver.returncode == 0, err[-2000:]
    ids = [r["id"] for r in lines(sink / "ready.ndjson")]
    assert sorted(ids) == sorted({*ids}) and len(ids) == 2001, (len(ids), len(set(ids)), err[-2000:])
    runs: dict[str, list[int]] = {}
    for path in marks.iterdir():
        for item_id in path.read_text().split():
            runs.setdefault(item_id, []).append(int(path.stem))
    named = {i for i in ids if i.startswith("item-")}
    assert named == {f"item-{i}" for i in range(2000)} and set(runs) >= named      # ran at the source
    twice_by_survivors = {i: pids for i, pids in runs.items() if len(pids) > 1 and not killed & set(pids)}
    assert not twice_by_survivors, f"{len(twice_by_survivors)} ids ran twice with no kill to explain it, e.g. " + \
        str(sorted(twice_by_survivors.items())[:5])


def test_kill_the_driver_then_resume_executes_nothing_twice(tmp_path: Path) -> None:
    sink, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    args = [str(COUNTING), "-w", "2", "--sink", str(sink), "--retries", "2", "--", "--n", "400", "--sleep", "0.01",
            "--marks", str(marks)]
    driver = subprocess.Popen([sys.executable, "-m", "sluice", "compute", *args], cwd=ROOT, env=_env(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(lines(sink / "ready.ndjson")) >= 100, 60, "some results")
    driver.kill()
    driver.wait(30)
    computed = {line.decode() for line in _cache(tmp_path, sink)}
    assert computed, "the result cache should hold what the workers computed"
    resumed = compute(*args[:7], "--resume", "--", *args[8:], home=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    executions = Counter(line for f in marks.iterdir() for line in f.read_text().split())
    assert [i for i in computed if executions[i] != 1] == []          # computed once, never again
    ids = [r["id"] for r in lines(sink / "ready.ndjson")]
    named = [i for i in ids if i.startswith("item-")]   # the id-less item gets a new UUID each plan()
    assert len(named) == len(set(named)) == 400 and len(ids) == len(set(ids))


def test_chunks_lost_while_no_driver_ran_are_sent_again_on_resume(tmp_path: Path) -> None:
    """A driver is killed with chunks in flight, and then those messages are lost (deleted from
    the run's queue and from kombu's unacknowledged hash, as a worker killed between taking a
    message and recording it loses it): resume notices that no message of the run exists and
    sends the awaited ids again, so the run finishes with every id exactly once."""
    import hashlib

    from sluice.client.batch.runs import private_queue, redis_dir
    from sluice.deploy.embedded import EmbeddedRedis
    from sluice.queues.broker.layout import RedisLayout

    sink = tmp_path / "run"
    args = [str(COUNTING), "-w", "1", "--sink", str(sink), "--", "--n", "300", "--sleep", "0.02"]
    driver = subprocess.Popen([sys.executable, "-m", "sluice", "compute", *args], cwd=ROOT, env=_env(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(lines(sink / "ready.ndjson")) >= 20, 60, "some results")
    driver.kill()
    driver.wait(30)
    run_id = hashlib.sha1(str(sink.resolve()).encode()).hexdigest()[:16]
    with EmbeddedRedis(redis_dir(tmp_path, run_id)) as server:
        client, layout = server.client(), RedisLayout()
        queue = private_queue(run_id)
        lost = len(layout.waiting(client, queue)) + layout.drop_held(client, queue)
        client.delete(*layout.queue_lists(queue))
    assert lost, "the killed driver should have left chunks in flight"
    resumed = compute(*args[:5], "--resume", "--", *args[6:], home=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    named = [r["id"] for r in lines(sink / "ready.ndjson") if r["id"].startswith("item-")]
    assert sorted(named) == sorted(f"item-{i}" for i in range(300))   # every id, exactly once


def _cache(home: Path, sink: Path) -> dict[bytes, bytes]:
    """The run's result cache right now, id -> entry (read from the embedded Redis's AOF by starting it)."""
    import hashlib

    from sluice import keys
    from sluice.client.batch.runs import redis_dir
    from sluice.deploy.embedded import EmbeddedRedis

    run_id = hashlib.sha1(str(sink.resolve()).encode()).hexdigest()[:16]
    with EmbeddedRedis(redis_dir(home, run_id)) as server:
        return server.client().hgetall(keys.run(run_id, "results"))


def test_ended_chunks_leave_the_cache_and_a_success_the_sink_lost_runs_again(tmp_path: Path) -> None:
    """Once a chunk has ended and its records are in the sink, its successes leave the Redis
    result cache (most of a finished run's are gone; the SkipSet stays). If the sink then loses
    lines (a machine crash before its pages reached disk), --resume restores those still cached
    and runs the others again, each once: every id ends exactly once in the sink."""
    sink, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    args = [str(COUNTING), "-w", "2", "--sink", str(sink), "--", "--n", "400", "--sleep", "0.01", "--marks", str(marks)]
    first = compute(*args, home=tmp_path)
    assert first.returncode == 0, first.stderr
    cached = {k.decode() for k in _cache(tmp_path, sink) if k.startswith(b"item-")}
    assert len(cached) < 200, f"{len(cached)} of 400 successes still cached after the run"
    kept = (sink / "ready.ndjson").read_text().splitlines(keepends=True)
    (sink / "ready.ndjson").write_text("".join(kept[100:]))
    lost = {json.loads(line)["id"] for line in kept[:100]} - {r["id"] for r in lines(sink / "ready.ndjson")}
    forgotten = {i for i in lost if i.startswith("item-")} - cached
    assert forgotten, "the earliest successes should have left the cache"
    resumed = compute(*args[:5], "--resume", "--", *args[6:], home=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    executions = Counter(line for f in marks.iterdir() for line in f.read_text().split())
    assert {i for i, n in executions.items() if n > 1 and i.startswith("item-")} == forgotten
    assert max(executions.values()) == 2
    ids = [r["id"] for r in lines(sink / "ready.ndjson") if r["id"].startswith("item-")]
    assert sorted(ids) == sorted(f"item-{i}" for i in range(400))


def test_redis_killed_and_restarted_mid_run_the_run_completes_with_every_id_once(tmp_path: Path) -> None:
    """kill -9 of Redis (AOF on) mid-run, restarted 2 s later on the same port: the driver and
    its workers wait the outage out and the same run finishes, exit 0, every id once in the sink."""
    from sluice.deploy.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp_path / "redis").start()
    sink = tmp_path / "run"
    args = [str(COUNTING), "-w", "2", "--sink", str(sink), "--broker", server.url, "--retries", "3"]
    plan = ["--", "--n", "600", "--sleep", "0.01"]
    try:
        driver = subprocess.Popen([sys.executable, "-m", "sluice", "compute", *args, *plan], cwd=ROOT,
                                  env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: len(lines(sink / "ready.ndjson")) >= 100, 60, "some results")
        server.process.kill()                           # kill -9: only what the AOF fsynced survives
        server.process.wait(10)
        time.sleep(2)
        server.start()
        _, err = driver.communicate(timeout=100)
        assert driver.returncode == 0, err[-3000:]
    finally:
        server.stop()
    ready, failures = lines(sink / "ready.ndjson"), lines(sink / "failures.ndjson")
    named = [r["id"] for r in ready + failures if r["id"].startswith("item-")]
    assert sorted(set(named)) == sorted(f"item-{i}" for i in range(600))
    assert len(named) == 600 and not failures


def test_cluster_workers_load_the_task_file_from_redis(redis_server: object, workers: object, tmp_path: Path) -> None:
    """With a broker and no -w, chunks go to the resource class that fits the run's compute and
    any sluice worker runs them, loading the task file from the run's source in Redis."""
    workers.start("tests.apps.basic", "cpu", "cluster-cpu", "--without-mingle", "--without-gossip")  # type: ignore[attr-defined]
    result = compute(str(EXAMPLE), "--broker", redis_server.url, "--results", "ndjson", "--", "--n", "20",  # type: ignore[attr-defined]
                     home=tmp_path, timeout=90)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 20 and {r["worker"] for r in records} == {"cluster-cpu@test"}


def test_records_naming_no_worker_do_not_count_as_a_healthy_worker_that_lets_the_last_be_quarantined(
        redis_client: object, tmp_path: Path) -> None:
    """A lost item's record names no worker. Counted as a worker of its own (it was, as "?"), it
    made the only worker that ever reported look like it had a healthy peer, and that last worker
    was quarantined. Here w1 is the only worker with records and fails past the limit: it stays;
    the control: once w2 has delivered a record, the driver's next poll quarantines w1, with no
    further failure needed (the peer's first record may well come after the last failure)."""
    from sluice import App, Compute
    from sluice.client.batch.driver import Driver
    from sluice.client.batch.progress import RunSettings
    from sluice.client.batch.sink import Sink
    from sluice.tasks import history
    from sluice.tasks.batch.records import Failure, Ready, encode
    from sluice.tasks.batch.taskfile import TaskFile
    from sluice.tasks.retry import AttemptRecord, Reason

    app = App("tests.quarantine.last")
    source = "def plan():\n    yield {'id': 'a'}\n\ndef execute(item):\n    return {}\n"
    run = RunSettings("last-run", "cpu", quarantine_after=1)
    driver = Driver(app, TaskFile.from_source("t.py", source, []), Sink(tmp_path / "sink").open(), run, 1)
    driver.waiting.update(["ok-1", "lost-1", "ok-2"])
    driver.write([encode(Ready("ok-1", {}, "w1@test", 1, time.time(), 0.01)),
                  encode(Failure.of_chunk("lost-1", RuntimeError("worker died"), "chunk-0"))])

    def fail_on_w1(attempt: int) -> None:
        record = AttemptRecord(attempt, "cpu", Compute(cpu="1"), Reason.WORKER_LOST, "killed", "w1@test")
        history.append(app.redis, "chunk-1", record)
        driver.quarantine.observe(["chunk-1"])

    fail_on_w1(1)
    assert set(driver.progress.per_worker) == {"w1@test"}
    assert driver.progress.quarantined == [], "the last worker with records was quarantined"
    driver.write([encode(Ready("ok-2", {}, "w2@test", 1, time.time(), 0.01))])
    driver._last_poll = 0.0
    driver._poll_chunks()
    assert driver.progress.quarantined == ["w1@test"]


def test_a_second_driver_of_a_running_run_is_refused_and_the_first_finishes_undisturbed(tmp_path: Path) -> None:
    """While a run goes (its last items wait on a gate), `--resume` of the same sink from another
    shell exits 2 naming the run and the pid that holds it, before touching anything; the first
    run then finishes with every id once."""
    sink, gate = tmp_path / "run", tmp_path / "gate"
    args = [str(COUNTING), "-w", "1", "--sink", str(sink)]
    plan = ["--", "--n", "20", "--gate", str(gate), "--gate-from", "1"]
    first = subprocess.Popen([sys.executable, "-m", "sluice", "compute", *args, *plan], cwd=ROOT, env=_env(tmp_path),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: lines(sink / "ready.ndjson"), 60, "the first run's ungated item")
        second = compute(*args, "--resume", "--", "--n", "20", home=tmp_path, timeout=60)
        assert second.returncode == 2, second.stderr
        assert "is already in use by sluice compute run" in second.stderr and f"(pid {first.pid})" in second.stderr
    finally:
        gate.touch()
        _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err[-2000:]
    named = [r["id"] for r in lines(sink / "ready.ndjson") if r["id"].startswith("item-")]
    assert sorted(named) == sorted(f"item-{i}" for i in range(20))


def test_a_broker_gone_for_longer_than_outage_wait_ends_the_run_with_75_and_nothing_failed(tmp_path: Path) -> None:
    """The run's broker is killed (-9) mid-run and stays down: past `outage_wait` (3 s here, two
    minutes by default) `sluice compute` exits 75, says to --resume, and records no item as
    failed; the control: the records written before the kill are all successes."""
    from sluice.deploy.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp_path / "redis").start()
    sink, gate = tmp_path / "run", tmp_path / "gate"
    args = [str(COUNTING), "-w", "1", "--sink", str(sink), "--broker", server.url]
    try:
        driver = subprocess.Popen(
            [sys.executable, "-m", "sluice", "compute", *args, "--", "--n", "20", "--gate", str(gate),
             "--gate-from", "1"],
            cwd=ROOT, env=_env(tmp_path) | {"SLUICE_OUTAGE_WAIT": "3"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        wait_for(lambda: lines(sink / "ready.ndjson"), 60, "the first result")
        server.process.kill()
        server.process.wait(10)
        _, err = driver.communicate(timeout=60)
    finally:
        gate.touch()
        server.stop()
    assert driver.returncode == 75, err[-2000:]
    assert "lost the broker for over 3 s" in err and "run again with --resume" in err
    assert lines(sink / "failures.ndjson") == [] and lines(sink / "ready.ndjson")
