"""The sluice command: help, explain, and bad input named clearly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def sluice(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice", *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT), "COLUMNS": "200"} | env)


def test_python_m_sluice_help() -> None:
    result = sluice("--help")
    assert result.returncode == 0
    for command in ("demo", "up", "worker", "status", "explain"):
        assert command in result.stdout


def test_the_command_loads_what_a_command_runs_only_when_it_runs() -> None:
    """`sluice --help` (and every command) starts without the batch driver, the demo app,
    prometheus_client or the kubernetes client: cli/ imports them in the command that needs them."""
    probe = "import sys, json; import sluice.cli; print(json.dumps(sorted(sys.modules)))"
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                           timeout=60, cwd=ROOT).stdout))
    assert not loaded & {"sluice.client.batch.launch", "sluice.client.batch.driver", "sluice.demo",
                         "sluice.deploy.metrics", "prometheus_client", "kubernetes"}, sorted(loaded)


@pytest.mark.usefixtures("redis_server")
def test_explain_prints_effective_compute_and_class() -> None:
    result = sluice("explain", "-A", "tests.apps.basic")
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:6]]
            for line in result.stdout.splitlines() if line.startswith("│")}
    assert rows["tests.apps.basic.big_task"] == ["memory=4Gi", "cpu=1 memory=4Gi", "-", "highmem"]
    assert rows["tests.apps.basic.default_task"] == ["(default)", "cpu=1 memory=512Mi", "-", "cpu"]


@pytest.mark.usefixtures("redis_server")
def test_explain_piped_keeps_whole_rows() -> None:
    """Piped (no terminal, no COLUMNS), `sluice explain` prints each task on one line with its
    whole name: rich would otherwise fit the table to 80 columns and cut the names."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "sluice", "explain", "-A", "tests.apps.basic"], capture_output=True,
                            text=True, timeout=60, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    names = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.startswith("│")]
    from tests.apps import basic

    assert len(names) >= 5 and set(names) <= set(basic.app.tasks), result.stdout   # whole names, none cut
    assert "tests.apps.basic.default_task" in names
    assert max(len(line) for line in result.stdout.splitlines()) > 80


@pytest.mark.usefixtures("redis_server")
def test_worker_rejects_an_unknown_class() -> None:
    result = sluice("worker", "-A", "tests.apps.basic", "--queue", "hugemem")
    assert result.returncode == 2
    assert "unknown resource class 'hugemem'" in result.stderr and "cpu, highmem, gpu" in result.stderr


def test_bad_config_is_one_clear_line() -> None:
    result = sluice("status", SLUICE_DEFAULT_MEMORY="lots")
    assert result.returncode == 2
    assert "memory 'lots' is not a quantity" in result.stderr   # one-line errors go to stderr, not into piped output
    assert "Traceback" not in result.stdout + result.stderr


def test_check_exit_codes(redis_server: object) -> None:
    import time

    from sluice import keys

    client = redis_server.client()  # type: ignore[attr-defined]
    assert sluice("check", "--worker", "ghost@nowhere").returncode == 3
    client.set(keys.worker_heartbeat("old@host"), json.dumps({"ts": time.time() - 600}))
    stale = sluice("check", "--worker", "old@host")
    assert stale.returncode == 4 and "STALE_HEARTBEAT" in stale.stdout
    client.set(keys.worker_heartbeat("fresh@host"), json.dumps({"ts": time.time()}))
    assert sluice("check", "--worker", "fresh@host").returncode == 0
    down = sluice("check", "--worker", "fresh@host", SLUICE_BROKER_URL="redis://127.0.0.1:1/0")
    assert down.returncode == 5 and "BROKER_DOWN" in down.stdout
