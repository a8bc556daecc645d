"""`sluice compute` under torchrun: rank 0 drives (and starts the embedded Redis), every rank
works, execute() sees its rank's LOCAL_RANK. Once with torch's real torchrun (CPU build, when
torch is installed) and once by setting the variables torchrun sets, with --broker (the ranks meet through Redis,
not torch's store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sluice.deploy.embedded import free_port
from tests.conftest import ROOT

pytestmark = pytest.mark.integration
RANKED = ROOT / "tests" / "tasks" / "where.py"
ITEMS = 120


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SLUICE_BROKER_URL", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return env | {"SLUICE_HOME": str(home), "PYTHONPATH": str(ROOT)}


def _check_sink(sink: Path) -> Counter[Any]:
    records = [json.loads(line) for line in (sink / "ready.ndjson").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(f"t-{i}" for i in range(ITEMS))   # each id exactly once
    assert all(r["result"]["x2"] == 2 * int(r["id"][2:]) for r in records)
    by_rank = Counter((r["result"]["local_rank"], r["worker"].split(".")[0]) for r in records)
    assert set(by_rank) == {("0", "r0"), ("1", "r1")}, by_rank                          # every rank worked
    return by_rank


def test_real_torchrun_rank_zero_drives_and_every_rank_works(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch (CPU build) is not installed: pip install torch==2.13.0")
    torchrun = Path(sys.executable).parent / "torchrun"
    sink = tmp_path / "sink"
    run = subprocess.run([str(torchrun), "--nproc_per_node=2", f"--master_port={free_port()}", "--no-python", "--",
                          str(Path(sys.executable).parent / "sluice"),
                          "compute", str(RANKED), "--sink", str(sink), "--", "--n", str(ITEMS)],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path, env=_env(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    _check_sink(sink)
    assert f"{ITEMS} ok, 0 failed" in run.stderr.replace("\n", " ")


def test_torchrun_environment_with_a_broker_meets_through_redis(redis_server: Any, tmp_path: Path) -> None:
    launch = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
              "TORCHELASTIC_RUN_ID": uuid.uuid4().hex, "LOCAL_WORLD_SIZE": "2"}
    sink = tmp_path / "sink"
    command = [sys.executable, "-m", "sluice", "compute", str(RANKED), "--sink", str(sink), "--broker", redis_server.url,
               "--", "--n", str(ITEMS)]
    ranks = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              env=_env(tmp_path) | launch | {"RANK": str(r), "LOCAL_RANK": str(r)})
             for r in (1, 0)]   # rank 1 first: it waits for rank 0 to announce the run
    outputs = [rank.communicate(timeout=240) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    _check_sink(sink)
    assert f"{ITEMS} ok" not in outputs[0][1] and f"{ITEMS} ok" in outputs[1][1].replace("\n", " ")  # rank 0 reports
