"""The worker's side of a template process: start one, have it fork sandboxes, hear them end.

A sandbox forked from a warm template takes a millisecond where starting Python takes tens;
``sandbox_main`` is the template's program and describes what a template is and its protocol.
This module is the other end of that protocol, apart from the sandbox that uses it, so the
sandbox reads as a process under a memory limit and not as the socket talk that starts one.
:class:`Templates` keeps the few templates one process served recently; which process keeps
them is ``pools``'s concern.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

from sluice.deploy.embedded import die_with_parent
from sluice.workers.remote import sandbox_main

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
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
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


class Templates:
    """The templates of the ``kept`` package environments used last, least recently used closed first."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self._templates: OrderedDict[Path | None, Template] = OrderedDict()

    def __contains__(self, env: object) -> bool:
        return env in self._templates

    def get(self, env: Path | None) -> Template:
        """The template of ``env``, started (again, if it had ended) when there is none."""
        template = self._templates.pop(env, None)
        if template is None or template.process.poll() is not None:
            if template is not None:
                template.close()
            template = Template(env)
        self._templates[env] = template
        while len(self._templates) > self.kept:
            self._templates.popitem(last=False)[1].close()
        return template

    def forget(self, env: Path | None) -> None:
        """Stop the template of ``env``, if there is one."""
        template = self._templates.pop(env, None)
        if template is not None:
            template.close()
