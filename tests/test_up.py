"""`sluice up` on the embedded default: starts everything, `sluice status` reports, Ctrl-C cleans up."""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import redis

from sluice import keys
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.integration


def _lines(stream: object, sink: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sink.put(line)


def test_up_status_and_ctrl_c(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SLUICE_BROKER_URL", "SLUICE_REMOTE_SECRET")}
    env |= {"SLUICE_HOME": str(tmp_path), "SLUICE_GPU_COUNT": "0", "PYTHONPATH": str(ROOT)}
    up = subprocess.Popen([sys.executable, "-m", "sluice", "up"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env, cwd=tmp_path)
    out: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(up.stdout, out), daemon=True).start()
    try:
        printed: list[str] = []
        wait_for(lambda: _drain(out, printed) and any("Ctrl-C stops everything" in line for line in printed),
                 60, "sluice up to print its banner")
        exports = dict(line.removeprefix("export ").strip().split("=", 1) for line in printed
                       if line.startswith("export "))
        url = exports["SLUICE_BROKER_URL"]
        assert url.startswith("redis://:") and "@127.0.0.1:" in url
        assert any("gpu: not started: no GPU here" in line for line in printed)
        flower = next(line.split()[1] for line in printed if line.strip().startswith("flower"))
        user, password = next(line for line in printed if "password" in line).split("(user ")[1].rstrip(")\n").split(
            ", password ")

        client = redis.Redis.from_url(url)
        for name in ("cpu", "highmem"):
            wait_for(lambda n=name: client.exists(keys.worker_heartbeat(f"{n}@{_host()}")), 60, f"{name} worker")
        assert wait_for(lambda: _status_code(flower, None) == 401, 60, "flower to ask for credentials")
        assert _status_code(flower, (user, password)) == 200

        from celery import Celery
        Celery(broker=url).send_task("anything", queue="gpu")
        status = subprocess.run([sys.executable, "-m", "sluice", "status"], capture_output=True, text=True, timeout=60,
                                env=env | {"SLUICE_BROKER_URL": url, "COLUMNS": "200"}, cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:6]]
                for line in status.stdout.splitlines() if line.startswith("│")}
        assert rows["cpu"] == ["0", "1", "0", "4"]       # queued, workers, running, slots
        assert rows["highmem"] == ["0", "1", "0", "1"]
        assert rows["gpu"] == ["1", "0", "0", "0"]

        # Flower's Broker view: the queues the workers serve (their class, the intake, each its own)
        # with their waiting messages; with the cpu worker stopped, three wait on cpu. gpu has no
        # worker, and Flower takes queue names from workers: it lists no gpu (sluice status does).
        auth = (user, password)
        wait_for(lambda: {"cpu", "highmem"} <= set(_flower_queue_lengths(flower, auth)), 60,
                 "flower to learn the queues the workers serve")
        cpu_worker = next(p for p in psutil.Process(up.pid).children() if "cpu@%h" in p.cmdline())
        cpu_worker.suspend()
        try:
            for _ in range(3):
                Celery(broker=url).send_task("anything", queue="cpu")
            lengths = wait_for(lambda: (found := _flower_queue_lengths(flower, auth))["cpu"] == 3 and found, 30,
                               "flower to count the three messages waiting on cpu")
            assert lengths["highmem"] == 0 and "gpu" not in lengths, lengths
            status, page = _get(f"{flower}/broker", auth)
            assert status == 200, page
            shown = dict(re.findall(rb'<tr id="([^"]+)">\s*<td>[^<]+</td>\s*<td[^>]*>(\d+)</td>', page))
            assert shown[b"cpu"] == b"3" and shown[b"highmem"] == b"0" and b"gpu" not in shown, page
        finally:
            cpu_worker.resume()

        # The compose `app` service's command: with no gpu worker (compose without --profile gpu) the
        # demo runs what has a worker, says what it skipped, and succeeds instead of waiting on it.
        demo = subprocess.run([sys.executable, "-m", "sluice.demo", "--wait-for-workers", "3"], capture_output=True,
                              text=True, timeout=90, env=env | {"SLUICE_BROKER_URL": url}, cwd=tmp_path)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "sluice.demo.word_count: 5 (queue cpu" in demo.stdout and "sluice.demo.join_tables: " in demo.stdout
        assert "sluice.demo.train: skipped: no worker serves the gpu class" in demo.stdout

        # A client that has only run the export lines can make remote calls (the signing secret included).
        client_env = env | exports | {"SLUICE_HOME": str(tmp_path / "client-home")}
        call = subprocess.run([sys.executable, "-c", REMOTE_CLIENT], capture_output=True, text=True, timeout=90,
                              env=client_env, cwd=tmp_path)
        assert call.returncode == 0, call.stderr
        assert call.stdout.split() == ["49", f"cpu@{_host()}"]
        assert len(exports["SLUICE_REMOTE_SECRET"]) == 64

        # A worker that dies is started again (and says so); so is Redis, and the workers reconnect.
        heartbeat = keys.worker_heartbeat(f"cpu@{_host()}")
        before = json.loads(client.get(heartbeat))["instance"]
        cpu_worker = next(p for p in psutil.Process(up.pid).children() if "cpu@%h" in p.cmdline())
        os.killpg(cpu_worker.pid, signal.SIGKILL)
        wait_for(lambda: _drain(out, printed) and any("restarted worker-cpu" in line for line in printed), 30,
                 "sluice up to restart the cpu worker")
        wait_for(lambda: (beat := client.get(heartbeat)) and json.loads(beat)["instance"] != before, 60,
                 "the new cpu worker's heartbeat")
        server = next(p for p in psutil.Process(up.pid).children() if p.name() == "redis-server")
        server.kill()
        wait_for(lambda: _drain(out, printed) and any("redis exited" in line for line in printed), 30,
                 "sluice up to restart redis")
        wait_for(lambda: _deleted(client, heartbeat), 30, "the restarted redis to answer")
        wait_for(lambda: client.exists(heartbeat), 60, "the cpu worker to reconnect and beat again")

        family = psutil.Process(up.pid).children(recursive=True)
        assert len(family) >= 4  # redis, two workers (plus their pool processes), flower
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(90)
    assert code == 0
    _, alive = psutil.wait_procs(family, timeout=10)
    assert alive == [], f"left behind: {alive}"
    assert not (tmp_path / "up.json").exists()


REMOTE_CLIENT = """
import sluice

@sluice.remote
def square(x):
    return x * x

call = square.spawn(7)
print(call.get(timeout=60), call.worker)
"""


def _drain(out: queue.Queue[str], printed: list[str]) -> bool:
    while not out.empty():
        printed.append(out.get())
    return True


def _deleted(client: redis.Redis, key: str) -> bool:
    try:
        client.delete(key)
        return True
    except redis.ConnectionError:
        return False


def _host() -> str:
    import socket
    return socket.gethostname()


def _status_code(url: str, auth: tuple[str, str] | None) -> int | None:
    return _get(url, auth)[0]


def _get(url: str, auth: tuple[str, str] | None) -> tuple[int | None, bytes]:
    """The status and body of a GET (None and no body when nothing answers)."""
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return None, b""


def _flower_queue_lengths(flower: str, auth: tuple[str, str]) -> dict[str, int]:
    """Flower's ``/api/queues/length`` after ``/api/workers?refresh=1`` (Flower learns the queues
    workers serve by inspecting them; it did once at its start, maybe before they were up)."""
    _get(f"{flower}/api/workers?refresh=1", auth)
    status, body = _get(f"{flower}/api/queues/length", auth)
    assert status == 200, body
    return {queue["name"]: queue["messages"] for queue in json.loads(body)["active_queues"]}
