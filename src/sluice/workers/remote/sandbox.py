"""A sandbox: a fresh Python subprocess that runs remote calls under a memory limit that grows.

The limit starts at the call's ``memory``. A monitor thread reads the sandbox's resident memory
(with its children) every few milliseconds: past ``threshold`` of the limit, the limit grows by
``factor`` up to ``ceiling``; past the limit, the sandbox is killed. A call whose sandbox dies
ends without a complete reply, which is what :class:`SandboxDied` reports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import psutil

from sluice.deploy.embedded import die_with_parent
from sluice.errors import SandboxDied
from sluice.units import format_size
from sluice.workers.remote import sandbox_main
from sluice.workers.watchdog import ProcessTree, kill_tree

Spawned = tuple[subprocess.Popen[bytes], BinaryIO, tempfile.TemporaryDirectory[str]]
#: One sandbox process started ahead of the next call (and the environment it was started with).
_spare: tuple[Path | None, Spawned] | None = None


def _spawn(env: Path | None) -> Spawned:
    reply_read, reply_write = os.pipe()
    workdir = tempfile.TemporaryDirectory(prefix="sluice-sandbox-")
    process = subprocess.Popen(
        [sys.executable, sandbox_main.__file__, str(env or ""), str(reply_write)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(reply_write,),
        cwd=workdir.name, env=os.environ | {"PYTHONUNBUFFERED": "1"}, preexec_fn=die_with_parent)
    os.close(reply_write)
    return process, os.fdopen(reply_read, "rb"), workdir


def warm_spare(env: Path | None) -> None:
    """Start a sandbox for the next call now, so that call does not wait for Python to start.
    It has run nothing when a call takes it: each call still gets a fresh sandbox."""
    global _spare
    if _spare is not None and _spare[0] == env and _spare[1][0].poll() is None:
        return
    _discard_spare()
    _spare = (env, _spawn(env))


def _take_spare(env: Path | None) -> Spawned | None:
    global _spare
    if _spare is None or _spare[0] != env or _spare[1][0].poll() is not None:
        return None
    taken, _spare = _spare[1], None
    return taken


def _discard_spare() -> None:
    global _spare
    if _spare is not None:
        process, replies, workdir = _spare[1]
        _spare = None
        process.kill()
        process.wait()
        replies.close()
        workdir.cleanup()


class Sandbox:
    """Use as a context manager; :meth:`call` runs one pickled call and returns the pickled reply."""

    def __init__(self, env: Path | None, start: int, ceiling: int, output: Callable[[str], None],
                 threshold: float = 0.9, factor: float = 2.0, interval: float = 0.01) -> None:
        self.env = env
        self.limit = min(start, ceiling)
        self.ceiling = ceiling
        self.threshold = threshold
        self.factor = factor
        self.interval = interval
        self.output = output
        self.limits = [self.limit]
        self.peak = 0
        self.killed_at: int | None = None
        self._call_done = threading.Event()
        self._stopped = threading.Event()

    def __enter__(self) -> Sandbox:
        self.process, self.replies, self._workdir = _take_spare(self.env) or _spawn(self.env)
        self._threads = [threading.Thread(target=self._read_output, daemon=True, name="sluice-sandbox-output"),
                         threading.Thread(target=self._monitor, daemon=True, name="sluice-sandbox-memory")]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def call(self, request: bytes) -> bytes:
        """Send one request, wait for its reply and for all of its output."""
        self._call_done.clear()
        try:
            assert self.process.stdin is not None
            sandbox_main.write_frame(self.process.stdin, request)
        except (BrokenPipeError, OSError):
            pass  # the sandbox is gone; the missing reply below says why
        reply = sandbox_main.read_frame(self.replies)
        if reply is None:
            self.process.wait()
            raise SandboxDied(self._death(), self.killed_at)
        self._call_done.wait(5.0)
        return reply

    def _death(self) -> str:
        if self.killed_at is not None:
            return (f"killed for memory: used {format_size(self.peak)}, over its limit of {format_size(self.killed_at)} "
                    f"(limits {' -> '.join(format_size(x) for x in self.limits)})")
        code = self.process.returncode
        if code is not None and code < 0:
            return f"crashed: it was killed by signal {signal.Signals(-code).name} without a complete response"
        return f"crashed: it exited with status {code} without a complete response"

    def close(self) -> None:
        """End the sandbox at once (with anything it started): its replies are all in."""
        self._stopped.set()
        if self.process.poll() is None:
            try:
                kill_tree(psutil.Process(self.process.pid))
            except psutil.Error:
                pass
        self.process.wait()
        for stream in (self.process.stdin, self.replies):
            if stream is not None:
                stream.close()
        for thread in self._threads:
            thread.join(2.0)
        self._workdir.cleanup()

    def _read_output(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line == sandbox_main.END_OF_CALL:
                self._call_done.set()
            else:
                self.output(line)
        self._call_done.set()

    def _monitor(self, tree_refresh: float = 0.2) -> None:
        """Grow the limit at ``threshold``; kill past it."""
        try:
            tree = ProcessTree(psutil.Process(self.process.pid), tree_refresh)
        except psutil.Error:
            return
        while not self._stopped.wait(self.interval):
            rss = tree.rss(time.monotonic())
            if rss is None:
                return
            self.peak = max(self.peak, rss)
            while rss > self.threshold * self.limit and self.limit < self.ceiling:
                grown = min(int(self.limit * self.factor), self.ceiling)
                self.output(f"sluice: memory {format_size(rss)} passed {self.threshold:.0%} of the "
                            f"{format_size(self.limit)} limit; limit raised to {format_size(grown)}")
                self.limit = grown
                self.limits.append(grown)
            if rss > self.limit:
                self.killed_at = self.limit
                kill_tree(tree.root)
                return
