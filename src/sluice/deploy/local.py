"""The local cluster behind ``sluice up``: Redis, one worker per class and Flower, as processes.

It is the same topology as the Kubernetes deployment and docker-compose.yml, run as child
processes of one command that stops them all cleanly (warm shutdown first) on Ctrl-C or SIGTERM.
Whatever else ends that command (SIGKILL, a crash), its children die with it
(:func:`~sluice.deploy.embedded.die_with_parent`): its Redis is gone, so workers left behind
could only wait for it, and a second ``sluice up`` would find them in its way.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sluice.config import Settings, UpState, embedded_state_path
from sluice.deploy.embedded import EmbeddedRedis, die_with_parent, free_port, private_dir, private_log
from sluice.queues.catalog import ResourceClass
from sluice.workers.gpu import gpu_count

log = logging.getLogger("sluice.up")


#: A child that dies is started again after 1 s, doubling for each quick death up to 60 s; one
#: that ran for STABLE_AFTER seconds starts again from 1 s.
RESTART_FIRST, RESTART_MAX, STABLE_AFTER = 1.0, 60.0, 60.0
#: Flower keeps nothing worth a warm shutdown: it gets this long after SIGTERM, then SIGKILL.
FLOWER_GRACE = 5.0


@dataclass
class Child:
    name: str
    args: list[str]
    process: subprocess.Popen[bytes]
    log_path: Path
    #: Environment of this child alone (on top of the cluster's): secrets go here, never in args.
    env: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    #: Restarts in a row that followed a quick death (sets the backoff).
    quick_deaths: int = 0
    #: When a dead child is due to start again (monotonic), None while it runs.
    restart_at: float | None = None


@dataclass
class LocalCluster:
    """Start with :meth:`start`, stop with :meth:`stop`; ``broker_url`` and ``flower_url`` say where."""

    app_module: str
    settings: Settings
    classes: list[ResourceClass]
    allow_no_gpu: bool = False
    flower: bool = True
    flower_port: int | None = None
    broker_url: str | None = None
    redis: EmbeddedRedis | None = None
    children: list[Child] = field(default_factory=list)
    flower_user: str = "sluice"
    flower_password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    #: Signs remote calls; the configured one, else a fresh one for this cluster.
    remote_secret: str = ""
    skipped: dict[str, str] = field(default_factory=dict)
    #: Where this cluster keeps its Redis data and logs (default: the sluice home).
    state_dir: Path | None = None
    #: Who runs the cluster, as the embedded Redis's lock names its owner.
    owner: str = "sluice up"

    @property
    def home(self) -> Path:
        return self.state_dir or self.settings.home

    @property
    def flower_url(self) -> str | None:
        return f"http://127.0.0.1:{self.flower_port}" if self.flower else None

    def __post_init__(self) -> None:
        self.remote_secret = self.remote_secret or self.settings.remote_secret or secrets.token_hex(32)

    def env(self) -> dict[str, str]:
        """The environment that points a process at this cluster (and lets it sign remote calls)."""
        return {"SLUICE_BROKER_URL": str(self.broker_url), "SLUICE_REMOTE_SECRET": self.remote_secret}

    def start(self) -> LocalCluster:
        if self.broker_url is None:
            self.redis = EmbeddedRedis(self.home / "redis", owner=self.owner).start()
            self.broker_url = self.redis.url
        try:
            for rc in self.classes:
                if rc.is_gpu and not self.allow_no_gpu and gpu_count() == 0:
                    self.skipped[rc.name] = "no GPU here (start it anyway with --allow-no-gpu)"
                    continue
                self._spawn(
                    f"worker-{rc.name}",
                    [
                        "-m",
                        "sluice",
                        "worker",
                        "-A",
                        self.app_module,
                        "--queue",
                        rc.name,
                        "--loglevel",
                        "INFO",
                        "-n",
                        f"{rc.name}@%h",
                        "-E",
                        *(["--allow-no-gpu"] if rc.is_gpu and self.allow_no_gpu else []),
                    ],
                )
            if self.flower:
                self.flower_port = self.flower_port or free_port()
                self._spawn(
                    "flower",
                    [
                        "-m",
                        "celery",
                        "-A",
                        self.app_module,
                        "flower",
                        "--address=127.0.0.1",
                        f"--port={self.flower_port}",
                    ],
                    env={"FLOWER_BASIC_AUTH": f"{self.flower_user}:{self.flower_password}"},
                )
        except BaseException:
            self.stop()
            raise
        self._write_state()
        return self

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log_path = private_dir(self.home / "logs") / f"{name}.log"
        child = Child(name, args, self._popen(args, log_path, env or {}), log_path, env=env or {})
        self.children.append(child)

    def _popen(self, args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        out = private_log(log_path)
        try:
            return subprocess.Popen(
                [sys.executable, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=os.environ | self.env() | env,
                start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
            )
        finally:
            os.close(out)

    def supervise(self) -> list[str]:
        """Start again what died: the embedded Redis at once (same port, password and AOF), a
        worker or Flower after a backoff. Returns one line per thing done, for the terminal."""
        said = []
        if self.redis is not None and self.redis.process is not None and self.redis.process.poll() is not None:
            code = self.redis.process.returncode
            self.redis.start()
            said.append(f"redis exited with code {code}; restarted it on the same port (its AOF reloaded)")
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is None and child.process.poll() is not None:
                quick = now - child.started < STABLE_AFTER
                child.quick_deaths = child.quick_deaths + 1 if quick else 1
                delay = min(RESTART_MAX, RESTART_FIRST * 2 ** (child.quick_deaths - 1))
                child.restart_at = now + delay
                said.append(
                    f"{child.name} exited with code {child.process.returncode}; restarting it in "
                    f"{delay:.0f}s (see {child.log_path})"
                )
            elif child.restart_at is not None and now >= child.restart_at:
                child.process = self._popen(child.args, child.log_path, child.env)
                child.started, child.restart_at = now, None
                said.append(f"restarted {child.name} (pid {child.process.pid})")
        if any(line.startswith("restarted") for line in said):
            self._write_state()
        return said

    def _write_state(self) -> None:
        UpState(
            pid=os.getpid(),
            broker_url=self.broker_url,
            flower_url=self.flower_url,
            app=self.app_module,
            children={c.name: c.process.pid for c in self.children},
            remote_secret=self.remote_secret,
        ).write(private_dir(self.home))

    def stop(self, grace: float = 30.0) -> None:
        """Warm shutdown: SIGTERM every child (Celery finishes running tasks), SIGKILL after ``grace``
        (Flower after FLOWER_GRACE); then Redis, last, so no child loses it while stopping."""
        for child in self.children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        for child in self.children:
            allowed = FLOWER_GRACE if child.name == "flower" else grace
            try:
                child.process.wait(max(0.1, started + allowed - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs; killing it", child.name, allowed)
                os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait()
        if self.redis is not None:
            self.redis.stop()
        embedded_state_path(self.home).unlink(missing_ok=True)
