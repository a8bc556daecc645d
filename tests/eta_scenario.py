"""A long-running scenario, started at collection time and checked by tests/test_eta.py at the end
of the suite: four tasks with a 150 s countdown, against a 10 s visibility timeout, on two
workers that share a queue. Its own redis-server and workers, so the rest of the suite (which
flushes its Redis between tests) runs meanwhile.

Run as ``python -m tests.eta_scenario DIR``; it writes DIR/outcome.json and stops everything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

COUNTDOWN = 150
VISIBILITY_TIMEOUT = 10
TASKS = 4
ROOT = Path(__file__).resolve().parent.parent


def start(directory: Path) -> subprocess.Popen[bytes]:
    """Start the scenario in the background; it ends by itself (bounded) after writing its outcome."""
    log = open(directory / "scenario.log", "ab")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen([sys.executable, "-m", "tests.eta_scenario", str(directory)], cwd=ROOT,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               env=os.environ | {"PYTHONPATH": str(ROOT)})
    log.close()
    return process


def _run(directory: Path) -> dict[str, object]:
    from sluice.deploy.embedded import EmbeddedRedis, die_with_parent

    server = EmbeddedRedis(directory / "redis").start()
    env = {"SLUICE_BROKER_URL": server.url, "SLUICE_HOME": str(directory / "home"),
           "SLUICE_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT), "PYTHONPATH": str(ROOT)}
    os.environ.update(env)
    workers = []
    try:
        for name in ("eta1", "eta2"):
            log = open(directory / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "sluice", "worker", "-A", "tests.apps.ladder", "--queue", "small",
                 "-n", f"{name}@test", "-c", "2", "--without-mingle", "--without-gossip"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy(), preexec_fn=die_with_parent))
            log.close()
        from sluice import keys
        from tests.apps import ladder

        client = server.client()
        deadline = time.monotonic() + 90
        while not all(client.exists(keys.worker_heartbeat(f"{n}@test")) for n in ("eta1", "eta2")):
            if time.monotonic() > deadline:
                raise TimeoutError("the scenario's workers did not start in 90 s")
            time.sleep(0.2)
        submitted = time.time()
        # the eta a countdown becomes (celery: now + countdown), given explicitly so the outcome has it
        eta = datetime.fromtimestamp(submitted + COUNTDOWN, timezone.utc)
        results = [ladder.long_step.apply_async((0.1,), eta=eta) for _ in range(TASKS)]
        for result in results:
            result.get(timeout=COUNTDOWN + 120 - (time.time() - submitted), propagate=False)
        return {"visibility_timeout": ladder.app.conf.broker_transport_options["visibility_timeout"],
                "eta": eta.timestamp(),
                "tasks": [{"id": r.id, "state": r.state,
                           "runs": [q.decode() for q in client.lrange(f"test:runs:{r.id}", 0, -1)],
                           # each attempt's start, as the task body recorded it (tests/apps/ladder.py)
                           "started": {k.decode().rsplit(":", 1)[1]: float(client.get(k))
                                       for k in client.keys(f"test:running:{r.id}:*")},
                           "completed": int(client.get(f"test:completed:{r.id}") or 0)} for r in results]}
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                worker.kill()
        server.stop()


def main() -> None:
    directory = Path(sys.argv[1])
    try:
        outcome = _run(directory)
    except Exception as exc:  # the test reports it
        outcome = {"error": f"{type(exc).__name__}: {exc}"}
    (directory / "outcome.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main()
