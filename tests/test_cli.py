"""The sluice command: help, explain, and bad input named clearly."""

from __future__ import annotations

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


@pytest.mark.usefixtures("redis_server")
def test_explain_prints_effective_compute_and_class() -> None:
    result = sluice("explain", "-A", "tests.apps.basic")
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:5]]
            for line in result.stdout.splitlines() if line.startswith("│")}
    assert rows["tests.apps.basic.big_task"] == ["memory=4Gi", "cpu=1 memory=4Gi", "highmem"]
    assert rows["tests.apps.basic.default_task"] == ["(default)", "cpu=1 memory=512Mi", "cpu"]


@pytest.mark.usefixtures("redis_server")
def test_worker_rejects_an_unknown_class() -> None:
    result = sluice("worker", "-A", "tests.apps.basic", "--queue", "hugemem")
    assert result.returncode == 2
    assert "unknown resource class 'hugemem'" in result.stderr and "cpu, highmem, gpu" in result.stderr


def test_bad_config_is_one_clear_line() -> None:
    result = sluice("status", SLUICE_DEFAULT_MEMORY="lots")
    assert result.returncode == 2
    assert "memory 'lots' is not a quantity" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
