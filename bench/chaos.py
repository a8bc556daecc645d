"""Faults against the promise "every accepted task ends in a result or a failure record, and a
body that completed is never reported failed". Six rows, each on its own Redis: `.delay()`
tasks and a `sluice compute` batch run, each under N whole-worker SIGKILLs (process group, as an
OOMKilled pod), N pool-child SIGKILLs, and one kill -9 + restart of Redis (AOF on). Executions
are counted from files the task bodies append to (bench/chaos_task.py), not from Redis, so the
count survives the Redis kill. Prints one JSON line.

Per row: submitted, succeeded, failed, lost (no final state / no sink record by the deadline),
completed_twice (bodies that ran to the end more than once: the at-least-once window),
re_executed (bodies started more than once: every kill mid-body causes one),
failed_but_completed (reported failed although a body ran to the end); batch rows also count
sink_duplicates (ids written to the sink more than once). Goal: 0 lost and 0
failed_but_completed in every row; duplicates are reported as they are.

Usage: python bench/chaos.py [--kills 5] [--tasks 300] [--items 1500]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import celery.exceptions
import psutil

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ("worker_kill", "pool_child_kill", "redis_restart")
# Recovery of a dead worker's tasks in about a second instead of ten: the bench counts outcomes,
# not recovery time (bench/escalation.py measures that with the default settings).
FAST_RECOVERY = {"SLUICE_HEARTBEAT_INTERVAL": "0.2", "SLUICE_REAPER_INTERVAL": "0.5"}
DEADLINE_S = 300


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def executions(marks: Path) -> tuple[Counter[str], Counter[str]]:
    """How many times each id's body started and ran to the end."""
    started: Counter[str] = Counter()
    done: Counter[str] = Counter()
    for path in marks.iterdir():
        for line in path.read_text().splitlines():
            kind, _, task_id = line.partition(" ")
            (started if kind == "start" else done)[task_id] += 1
    return started, done


def tally(ids: list[str], outcome: dict[str, str], marks: Path) -> dict[str, int]:
    started, done = executions(marks)
    return {"submitted": len(ids),
            "succeeded": sum(outcome.get(i) == "success" for i in ids),
            "failed": sum(outcome.get(i) == "failure" for i in ids),
            "lost": sum(i not in outcome for i in ids),
            "completed_twice": sum(done[i] > 1 for i in ids),
            "re_executed": sum(started[i] > 1 for i in ids),
            "failed_but_completed": sum(outcome.get(i) == "failure" and done[i] > 0 for i in ids)}


def restart_redis(server: object) -> None:
    """kill -9, two seconds of outage, start again on the same port and AOF."""
    server.process.kill()  # type: ignore[attr-defined]
    server.process.wait(10)  # type: ignore[attr-defined]
    time.sleep(2)
    server.start()  # type: ignore[attr-defined]


def pool_children(worker_pid: int) -> list[psutil.Process]:
    try:
        return [c for c in psutil.Process(worker_pid).children() if c.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


def kill_pool_child(worker_pid: int) -> bool:
    children = pool_children(worker_pid)
    if not children:
        return False
    try:
        random.choice(children).kill()
    except psutil.Error:
        return False
    return True


class DelayRow:
    """Two `sluice worker` processes of bench.chaos_app (-c 2) and ``tasks`` tasks sent by a
    client App (the web app's side: it routes by name, the workers hold the code)."""

    def __init__(self, server: object, tmp: Path, env: dict[str, str]) -> None:
        from sluice import App

        self.server, self.env = server, env
        self.sender = App("bench.chaos.sender", broker=server.url)  # type: ignore[attr-defined]
        self.client = server.client()  # type: ignore[attr-defined]
        self.marks = tmp / "marks"
        self.marks.mkdir()
        self.workers = [self.start_worker(), self.start_worker()]

    def start_worker(self) -> subprocess.Popen[bytes]:
        from sluice import keys

        name = f"chaos-{uuid.uuid4().hex[:6]}@bench"
        process = subprocess.Popen(
            [sys.executable, "-m", "sluice", "worker", "-A", "bench.chaos_app", "-c", "2", "-n", name,
             "--without-mingle", "--without-gossip", "--loglevel", "WARNING"],
            cwd=ROOT, env=self.env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: self.client.exists(keys.worker_heartbeat(name)), 60, f"worker {name}")
        return process

    def started(self) -> int:
        return sum(executions(self.marks)[0].values())

    def run(self, fault: str, kills: int, tasks: int, seconds: float) -> dict[str, object]:
        results = [self.sender.send_task("bench.chaos.step", args=(seconds, str(self.marks))) for _ in range(tasks)]
        injected = 0
        try:
            if fault == "redis_restart":
                wait_until(lambda: self.started() >= tasks // 3, 120, "a third of the tasks to start")
                restart_redis(self.server)
                injected = 1
            while fault != "redis_restart" and injected < kills and self.started() < tasks:
                time.sleep(0.5)
                victim = random.choice(self.workers)
                if fault == "worker_kill":
                    os.killpg(victim.pid, signal.SIGKILL)
                    victim.wait(30)
                    self.workers.remove(victim)
                    self.workers.append(self.start_worker())  # the replacement pod
                    injected += 1
                else:
                    injected += kill_pool_child(victim.pid)
            outcome = {}
            deadline = time.monotonic() + DEADLINE_S
            for result in results:
                with contextlib.suppress(celery.exceptions.TimeoutError):  # no final state: "lost"
                    result.get(timeout=max(0.1, deadline - time.monotonic()), propagate=False)
                    outcome[result.id] = "success" if result.state == "SUCCESS" else "failure"
        finally:
            for process in self.workers:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        return {"mode": "delay", "fault": fault, "injected": injected,
                **tally([r.id for r in results], outcome, self.marks)}


def batch_row(server: object, tmp: Path, env: dict[str, str], fault: str, kills: int, items: int,
              seconds: float) -> dict[str, object]:
    """`sluice compute bench/chaos_task.py -w 2 --per-worker 2` against ``server``."""
    from tests.processes import driver_workers

    marks, sink = tmp / "marks", tmp / "sink"
    marks.mkdir()
    driver = subprocess.Popen(
        [sys.executable, "-m", "sluice", "compute", str(ROOT / "bench" / "chaos_task.py"), "-w", "2",
         "--per-worker", "2", "--retries", "10", "--broker", server.url, "--sink", str(sink),  # type: ignore[attr-defined]
         "--results", "quiet", "--", "--n", str(items), "--sleep", str(seconds), "--marks", str(marks)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def started() -> int:
        return sum(executions(marks)[0].values())

    injected = 0
    try:
        if fault == "redis_restart":
            wait_until(lambda: started() >= items // 3, 120, "a third of the items to start")
            restart_redis(server)
            injected = 1
        while fault != "redis_restart" and injected < kills and driver.poll() is None and started() < items:
            time.sleep(0.5)
            victims = driver_workers(driver)
            if len(victims) < 2:  # wait for the driver to replace the last one killed
                continue
            victim = random.choice(victims)
            if fault == "worker_kill":
                os.killpg(victim.pid, signal.SIGKILL)
                injected += 1
            else:
                injected += kill_pool_child(victim.pid)
        driver.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.communicate()
    records = [json.loads(line) for name in ("ready.ndjson", "failures.ndjson")
               for line in (sink / name).read_text().splitlines() if (sink / name).exists() and line.strip()]
    outcome = {r["id"]: ("failure" if "error" in r else "success") for r in records}
    ids = [f"item-{i}" for i in range(items)]
    return {"mode": "batch", "fault": fault, "injected": injected, "driver_exit": driver.returncode,
            **tally(ids, outcome, marks), "sink_duplicates": len(records) - len(outcome)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5, help="whole-worker kills and pool-child kills per row")
    parser.add_argument("--tasks", type=int, default=300, help=".delay() tasks per row")
    parser.add_argument("--seconds", type=float, default=0.25, help="body time of each .delay() task")
    parser.add_argument("--items", type=int, default=1500, help="batch items per row")
    parser.add_argument("--item-seconds", type=float, default=0.02, help="body time of each batch item")
    args = parser.parse_args()
    from sluice.deploy.embedded import EmbeddedRedis

    rows = []
    started = time.monotonic()
    for mode in ("delay", "batch"):
        for fault in FAULTS:
            with tempfile.TemporaryDirectory() as tmp_dir, EmbeddedRedis(Path(tmp_dir) / "redis") as server:
                tmp = Path(tmp_dir)
                env = os.environ | FAST_RECOVERY | {"PYTHONPATH": str(ROOT), "SLUICE_BROKER_URL": server.url,
                                                    "SLUICE_HOME": str(tmp / "home")}
                if mode == "delay":
                    rows.append(DelayRow(server, tmp, env).run(fault, args.kills, args.tasks, args.seconds))
                else:
                    rows.append(batch_row(server, tmp, env, fault, args.kills, args.items, args.item_seconds))
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(json.dumps({"benchmark": "chaos", "kills": args.kills, "tasks": args.tasks, "items": args.items,
                      "settings": FAST_RECOVERY, "wall_s": round(time.monotonic() - started, 1), "rows": rows,
                      "goal": "0 lost and 0 failed_but_completed in every row"}))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
