"""``-w N``: real Celery worker processes on a run-private queue, children of the driver.

They die with the driver (PR_SET_PDEATHSIG), so a killed driver leaves no worker behind; what
they held goes back to the queue through the orphan reaper of the next run's workers.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
from pathlib import Path

from sluice.deploy.embedded import die_with_parent
from sluice.errors import ConfigurationError

#: Local workers are few and all ours: notice a dead one, and its held messages, within seconds.
LOCAL_ENV = {"SLUICE_HEARTBEAT_INTERVAL": "0.5", "SLUICE_REAPER_INTERVAL": "1", "SLUICE_ORPHAN_GRACE": "5"}


class LocalWorkers:
    def __init__(
        self,
        count: int,
        per_worker: int,
        queue: str,
        run_id: str,
        python: str,
        log_dir: Path,
        env: dict[str, str],
        prefix: str = "",
    ) -> None:
        """``prefix`` tells apart the workers of each torchrun rank (``r1.``)."""
        if count < 1 or per_worker < 1:
            raise ConfigurationError(f"-w {count} --per-worker {per_worker}: both must be at least 1")
        self.count, self.per_worker, self.queue, self.run_id = count, per_worker, queue, run_id
        self.python, self.log_dir, self.env, self.prefix = python, log_dir, env, prefix
        self.processes: list[subprocess.Popen[bytes]] = []

    def hostname(self, index: int) -> str:
        return f"{self.prefix}w{index}.{self.run_id[:8]}@%h"

    def start(self) -> LocalWorkers:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes = [self._spawn(index) for index in range(self.count)]
        return self

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        with open(self.log_dir / f"worker-{index}.log", "ab") as log:
            return subprocess.Popen(
                [
                    self.python,
                    "-m",
                    "celery",
                    "-A",
                    "sluice.workers.batch.worker_app",
                    "worker",
                    "-Q",
                    self.queue,
                    "-c",
                    str(self.per_worker),
                    "-n",
                    self.hostname(index),
                    "--without-mingle",
                    "--without-gossip",
                    "--loglevel",
                    "WARNING",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=os.environ | LOCAL_ENV | self.env,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
                start_new_session=True,
            )

    def revive(self) -> list[int]:
        """Restart local workers that died (a kill -9, an OOM kill); returns their indexes."""
        dead = [i for i, p in enumerate(self.processes) if p.poll() is not None]
        for index in dead:
            self.processes[index] = self._spawn(index)
        return dead

    def stop(self, interrupt: bool = False, idle: bool = False, timeout: float = 30.0) -> None:
        """Warm shutdown when the run is done; on Ctrl-C a cold one, interrupting running items.
        ``idle``: nothing runs and nothing is held (every record is in and acknowledged), so a
        warm shutdown (a second or more) would only wait: kill them at once."""
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL if interrupt or idle else signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout)
