"""A worker goes by one name, its node name, in its heartbeat, its ledger claims and its direct
queue, however it was started: ``sluice worker``, plain ``celery worker``, or Celery's testing
helpers (``start_worker``, behind the ``celery_worker`` pytest fixture), whose pool processes see
the machine's hostname as ``request.hostname``. Were the claim to name a worker with no
heartbeat, the orphan reaper would take a running task for a dead worker's and put its message
back, and the free slot beside it would run the body a second time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from sluice import keys
from sluice.tasks import ledger
from tests.conftest import ROOT, Workers, wait_for

pytestmark = pytest.mark.integration

#: The reaper sweeps every 0.5 s, so a 4 s task outlives several sweeps.
FAST_RECOVERY = {"SLUICE_HEARTBEAT_INTERVAL": "0.2", "SLUICE_REAPER_INTERVAL": "0.5"}
TASK_SECONDS = 4.0


def _start_embedded(tmp_path: Path, nodename: str) -> subprocess.Popen[bytes]:
    log = open(tmp_path / "embedded.log", "ab")
    process = subprocess.Popen([sys.executable, "-m", "tests.embedded_worker", "tests.apps.identity", "cpu", nodename],
                               cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               env=os.environ | {"PYTHONPATH": str(ROOT)} | FAST_RECOVERY)
    log.close()
    return process


@pytest.mark.parametrize("started_by", ["sluice worker", "celery worker", "celery start_worker"])
def test_a_long_task_beside_a_free_slot_runs_once_however_the_worker_was_started(
        started_by: str, redis_client: redis.Redis, workers: Workers, tmp_path: Path) -> None:
    """One task held longer than several reaper sweeps, with a second slot free, runs its body once,
    and the ledger claim and the task itself name the worker's node name, which has a heartbeat."""
    from tests.apps.identity import counted

    nodename = f"ident-{started_by.split()[-1].replace('_', '-')}@test"
    if started_by == "celery start_worker":
        process = _start_embedded(tmp_path, nodename)
        try:
            wait_for(lambda: process.poll() is not None or redis_client.exists(keys.worker_heartbeat(nodename)),
                     60, f"the embedded worker {nodename} to start")
            assert process.poll() is None, (tmp_path / "embedded.log").read_text(errors="replace")
            _run_once(redis_client, counted, nodename)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
    else:
        workers.start("tests.apps.identity", "cpu", nodename.split("@")[0], "-c", "2", "--without-mingle",
                      "--without-gossip", plain_celery=started_by == "celery worker", env=FAST_RECOVERY)
        _run_once(redis_client, counted, nodename)


def _run_once(client: redis.Redis, counted: object, nodename: str) -> None:
    result = counted.delay(TASK_SECONDS)  # type: ignore[attr-defined]
    ran = f"test:ran:{result.id}"
    wait_for(lambda: client.llen(ran), 30, "the task's body to start")
    claim = ledger.current(client, result.id)
    assert claim is not None and claim.worker == nodename, f"the ledger claim names {claim and claim.worker!r}"
    assert client.exists(keys.worker_heartbeat(claim.worker)), "the claimed worker has no heartbeat"
    assert result.get(timeout=60) == nodename
    # A message put back during the 4 s would have started again on the free slot within a sweep.
    assert client.lrange(ran, 0, -1) == [nodename.encode()], "the body ran more than once, or under another name"
