"""A sandbox: a fresh process, forked from a warm template, that runs remote calls under a
memory limit that grows.

The limit starts at the call's ``memory``. A monitor thread reads the sandbox's resident memory
(with its children) every few milliseconds: past ``threshold`` of the limit, the limit grows by
``factor`` up to ``ceiling``; past the limit, the sandbox is killed. A call whose sandbox dies
ends without a complete reply, which is what :class:`SandboxDied` reports.

Each pool process keeps one template per package environment it served recently
(:data:`TEMPLATES_KEPT`); see ``sandbox_main`` for what a template is and its protocol.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import psutil

from sluice.deploy.embedded import die_with_parent
from sluice.errors import SandboxDied
from sluice.units import format_size
from sluice.workers.remote import sandbox_main
from sluice.workers.watchdog import ProcessTree, kill_tree

#: Templates a pool process keeps, least recently used dropped first. Each is an idle Python
#: process of about 15 MB resident (its spare sandbox shares those pages), and the watchdog
#: counts both in the memory of the pool process that started them, as it counted the spare
#: interpreter that sandboxes were before templates.
TEMPLATES_KEPT = 2
#: How long to wait for a template to answer (it starts Python on its first fork).
TEMPLATE_TIMEOUT = 30.0


class TemplateGone(Exception):
    """The template process ended or stopped answering."""


class Template:
    """A Python process ready to fork sandboxes for one package environment."""

    def __init__(self, env: Path | None) -> None:
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, sandbox_main.__file__, str(env or ""), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=os.environ | {"PYTHONUNBUFFERED": "1"},
                preexec_fn=die_with_parent,
            )
        self.ended: dict[int, int] = {}

    def fork(self, workdir: str, fds: tuple[int, int, int]) -> int:
        """Start a sandbox in ``workdir`` on the pipe ends ``fds`` (requests, replies, output): its pid."""
        try:
            socket.send_fds(self.control, [workdir.encode()], list(fds))
        except OSError as exc:
            raise TemplateGone(str(exc)) from None
        while True:
            kind, pid, _ = self._notice(TEMPLATE_TIMEOUT)
            if kind == b"P":
                return pid

    def exit_code(self, pid: int, timeout: float) -> int | None:
        """The sandbox's exit code once it ended (negative: the signal); None if not told in time."""
        deadline = time.monotonic() + timeout
        try:
            while pid not in self.ended:
                self._notice(max(0.0, deadline - time.monotonic()))
        except TemplateGone:
            return None
        return self.ended.pop(pid)

    def _notice(self, timeout: float) -> tuple[bytes, int, int]:
        try:
            self.control.settimeout(timeout)  # a closed socket (the template was stopped) fails here
            data = self.control.recv(sandbox_main.NOTICE.size)
        except OSError as exc:  # a timeout included
            raise TemplateGone(str(exc) or type(exc).__name__) from None
        if not data:
            raise TemplateGone("the template ended")
        kind, pid, code = sandbox_main.NOTICE.unpack(data)
        if kind == b"X":
            self.ended[pid] = code
        return kind, pid, code

    def close(self) -> None:
        """End the template; sandboxes it forked die with it."""
        self.control.close()
        self.process.kill()
        self.process.wait()


_templates: OrderedDict[Path | None, Template] = OrderedDict()


def _template(env: Path | None) -> Template:
    template = _templates.pop(env, None)
    if template is None or template.process.poll() is not None:
        if template is not None:
            template.close()
        template = Template(env)
    _templates[env] = template
    while len(_templates) > TEMPLATES_KEPT:
        _templates.popitem(last=False)[1].close()
    return template


def forget_template(env: Path | None) -> None:
    """Stop the template of ``env`` (an environment about to be removed)."""
    template = _templates.pop(env, None)
    if template is not None:
        template.close()


@dataclass
class Forked:
    """A sandbox process, forked and waiting for its first request, with its pipes and directory."""

    env: Path | None
    template: Template
    pid: int
    #: taken at once, while the pid is surely the sandbox's: psutil then never signals a reused pid
    process: psutil.Process | None
    requests: BinaryIO
    replies: BinaryIO
    output: BinaryIO
    workdir: tempfile.TemporaryDirectory[str]
    exit_code: int | None = None
    reaped: bool = False

    @classmethod
    def start(cls, env: Path | None) -> Forked:
        """Fork one from the template of ``env``, starting that template (again, if it had gone)."""
        workdir = tempfile.TemporaryDirectory(prefix="sluice-sandbox-")
        (requests_read, requests_write), (replies_read, replies_write), (output_read, output_write) = (
            os.pipe(),
            os.pipe(),
            os.pipe(),
        )
        theirs = (requests_read, replies_write, output_write)
        try:
            for last_try in (False, True):
                template = _template(env)
                try:
                    pid = template.fork(workdir.name, theirs)
                    break
                except TemplateGone as gone:
                    forget_template(env)
                    if last_try:
                        raise SandboxDied(f"could not be started: its template process {gone}") from None
        except BaseException:  # no sandbox: nothing will read or write our ends
            for fd in (requests_write, replies_read, output_read):
                os.close(fd)
            workdir.cleanup()
            raise
        finally:
            for fd in theirs:
                os.close(fd)  # the sandbox holds them now: each stream ends when the sandbox does
        try:
            process: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            process = None
        return cls(
            env,
            template,
            pid,
            process,
            os.fdopen(requests_write, "wb"),
            os.fdopen(replies_read, "rb"),
            os.fdopen(output_read, "rb"),
            workdir,
        )

    def alive(self) -> bool:
        try:
            return self.process is not None and self.process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def wait(self) -> int | None:
        """Its exit code once it has ended (negative: the signal; None if its template did not say)."""
        if not self.reaped:
            self.exit_code, self.reaped = self.template.exit_code(self.pid, 5.0), True
        return self.exit_code

    def end(self) -> None:
        """Kill it with anything it started, and wait for it."""
        if self.process is not None and not self.reaped:
            kill_tree(self.process)
        self.wait()
        for stream in (self.requests, self.replies):
            try:
                stream.close()
            except OSError:
                pass

    def clean_up(self) -> None:
        """Once it has ended and its output is read: the last of its files."""
        self.output.close()
        self.workdir.cleanup()


#: Sandboxes whose calls have replied, ended by :func:`close_retired`.
_retired: list[Sandbox] = []
#: A sandbox forked ahead of the next call (it has run nothing), for the environment last used.
_spare: Forked | None = None


def _take_spare(env: Path | None) -> Forked | None:
    global _spare
    spare, _spare = _spare, None
    if spare is not None and spare.env == env and spare.alive():
        return spare
    if spare is not None:
        spare.end()
        spare.clean_up()
    return None


def close_retired(**_: object) -> None:
    """End the sandboxes whose calls have replied and fork a spare for the next call. Connected
    to ``task_postrun``, which Celery sends once the task's result is stored, so neither ending a
    sandbox (its process tree is found and killed, its exit awaited) nor forking the next one is
    part of a call's latency."""
    global _spare
    if not _retired:
        return
    env = _retired[-1].env
    while _retired:
        _retired.pop().close()
    if _spare is None and env in _templates:  # not forgotten: its environment stays
        try:
            _spare = Forked.start(env)
        except SandboxDied:
            pass  # the next call forks its own and says why if it cannot


class Sandbox:
    """Use as a context manager; :meth:`call` runs one pickled call and returns the pickled reply.
    With ``close_later`` a block that ends without an exception retires the sandbox instead of
    ending it (see :func:`close_retired`)."""

    def __init__(
        self,
        env: Path | None,
        start: int,
        ceiling: int,
        output: Callable[[str], None],
        threshold: float = 0.9,
        factor: float = 2.0,
        interval: float = 0.01,
        close_later: bool = False,
    ) -> None:
        self.env = env
        self.close_later = close_later
        self.limit = min(start, ceiling)
        self.ceiling = ceiling
        self.threshold = threshold
        self.factor = factor
        self.interval = interval
        self.output = output
        self.limits = [self.limit]
        self.peak = 0
        self.killed_at: int | None = None
        self.exit_code: int | None = None  #: set when the sandbox died during a call
        self._call_done = threading.Event()
        self._stopped = threading.Event()

    def __enter__(self) -> Sandbox:
        close_retired()  # at most one retired sandbox lingers, even if no task_postrun came
        self.forked = _take_spare(self.env) or Forked.start(self.env)
        self._threads = [
            threading.Thread(target=self._read_output, daemon=True, name="sluice-sandbox-output"),
            threading.Thread(target=self._monitor, daemon=True, name="sluice-sandbox-memory"),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.close_later and kind is None:
            _retired.append(self)
        else:
            self.close()

    def call(self, request: bytes) -> bytes:
        """Send one request, wait for its reply and for all of its output."""
        self._call_done.clear()
        try:
            sandbox_main.write_frame(self.forked.requests, request)
        except (BrokenPipeError, OSError):
            pass  # the sandbox is gone; the missing reply below says why
        reply = sandbox_main.read_frame(self.forked.replies)
        if reply is None:
            self.exit_code = self.forked.wait()
            raise SandboxDied(self._death(), self.killed_at)
        self._call_done.wait(5.0)
        return reply

    def _death(self) -> str:
        if self.killed_at is not None:
            return (
                f"killed for memory: used {format_size(self.peak)}, over its limit of {format_size(self.killed_at)} "
                f"(limits {' -> '.join(format_size(x) for x in self.limits)})"
            )
        code = self.exit_code
        if code is not None and code < 0:
            return f"crashed: it was killed by signal {signal.Signals(-code).name} without a complete response"
        if code is None:
            return "crashed: it ended without a complete response"
        return f"crashed: it exited with status {code} without a complete response"

    def close(self) -> None:
        """End the sandbox at once (with anything it started): its replies are all in."""
        self._stopped.set()
        self.forked.end()
        for thread in self._threads:
            thread.join(2.0)
        self.forked.clean_up()

    def _read_output(self) -> None:
        for raw in self.forked.output:
            line = raw.decode(errors="replace").rstrip("\n")
            if line == sandbox_main.END_OF_CALL:
                self._call_done.set()
            else:
                self.output(line)
        self._call_done.set()

    def _monitor(self, tree_refresh: float = 0.2) -> None:
        """Grow the limit at ``threshold``; kill past it."""
        if self.forked.process is None:
            return
        tree = ProcessTree(self.forked.process, tree_refresh)
        while not self._stopped.wait(self.interval):
            rss = tree.rss(time.monotonic())
            if rss is None:
                return
            self.peak = max(self.peak, rss)
            while rss > self.threshold * self.limit and self.limit < self.ceiling:
                grown = min(int(self.limit * self.factor), self.ceiling)
                self.output(
                    f"sluice: memory {format_size(rss)} passed {self.threshold:.0%} of the "
                    f"{format_size(self.limit)} limit; limit raised to {format_size(grown)}"
                )
                self.limit = grown
                self.limits.append(grown)
            if rss > self.limit:
                self.killed_at = self.limit
                kill_tree(tree.root)
                return
