"""What batch runs leave behind expires: their keys in Redis get run_ttl once the run ends,
their directories (default sinks included) go on the same schedule unless kept, `sluice runs`
lists them with their sizes and `sluice runs forget` deletes one. Runs without a broker each get
a Redis of their own, so two at once on one home do not share an append-only file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from sluice import keys
from sluice.client.batch import runs
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "task.py"


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return env | {"SLUICE_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "300", **extra}


def sluice(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice", *args], capture_output=True, text=True, timeout=100,
                          cwd=ROOT, env=env)


def _run_id(stderr: str) -> str:
    return re.search(r"run ([0-9a-f]{16}): ", stderr).group(1)  # type: ignore[union-attr]


def test_a_runs_redis_keys_expire_and_forget_deletes_them(tmp_path: Path, redis_server: object) -> None:
    """On a shared broker: once the run ends every key it left has a TTL of run_ttl (none is
    kept forever under noeviction); `sluice runs` lists the run with its size in Redis and on
    disk; `sluice runs forget` deletes its keys and its directory."""
    url = redis_server.url  # type: ignore[attr-defined]
    env = _env(tmp_path, SLUICE_BROKER_URL=url)
    done = sluice("compute", str(EXAMPLE), "-w", "1", "--", "--n", "40", env=env)
    assert done.returncode == 0, done.stderr
    run_id = _run_id(done.stderr)
    client = redis.Redis.from_url(url)
    left = [key for key in runs.run_keys(run_id) if client.exists(key)]
    assert {keys.run(run_id, "results"), keys.run(run_id, "skip"), keys.run(run_id, "source")} <= set(left)
    ttls = [client.ttl(key) for key in left]
    assert all(0 < ttl <= 3 * 86400 for ttl in ttls), dict(zip(left, ttls))

    listed = sluice("runs", env=env)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if run_id in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[2] == "ok (exit 0)" and cells[6] in ("in 3d", "in 72h"), row
    assert not cells[4].startswith("0B") and not cells[5].startswith("0B"), row   # redis, disk
    assert (tmp_path / "runs" / run_id / "ready.ndjson").exists()

    forgot = sluice("runs", "forget", run_id, env=env)
    assert forgot.returncode == 0, forgot.stdout + forgot.stderr
    assert not [key for key in runs.run_keys(run_id) if client.exists(key)]
    assert not (tmp_path / "runs" / run_id).exists()
    assert run_id not in sluice("runs", env=env).stdout


def test_two_runs_at_once_without_a_broker_and_their_directories_expire_unless_kept(tmp_path: Path) -> None:
    """Two `sluice compute` runs at once on one home, no broker: each starts its own Redis (no
    second server on one AOF) and both finish. With run_ttl 1 s, the next `sluice runs` deletes
    the directory of the run that was not kept, default sink included, and keeps the other."""
    env = _env(tmp_path, SLUICE_RUN_TTL="1")
    first = subprocess.Popen([sys.executable, "-m", "sluice", "compute", str(EXAMPLE), "-w", "1", "--", "--n", "30"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = sluice("compute", str(EXAMPLE), "-w", "1", "--keep", "--", "--n", "30", env=env)
    out, err = first.communicate(timeout=100)
    assert first.returncode == 0 and second.returncode == 0, err + second.stderr
    gone, kept = _run_id(err), _run_id(second.stderr)
    for run_id in (gone, kept):
        assert (runs.redis_dir(tmp_path, run_id) / "appendonlydir").is_dir(), f"run {run_id} had no Redis of its own"
        assert len((tmp_path / "runs" / run_id / "ready.ndjson").read_text().splitlines()) == 30
    time.sleep(1.5)
    listed = sluice("runs", env=env)
    assert listed.returncode == 0, listed.stderr
    assert f"expired: run {gone}" in listed.stdout
    assert not (tmp_path / "runs" / gone).exists()
    assert (tmp_path / "runs" / kept / "ready.ndjson").exists()
    row = next(line for line in listed.stdout.splitlines() if kept in line)
    assert "kept" in row and "embedded" in row, row
