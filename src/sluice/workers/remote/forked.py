"""One sandbox process as the worker holds it: its pid, its three pipes and its directory.

Forking a sandbox and ending it are apart from running calls in it, because a sandbox can be
forked ahead of the call it will serve (the spare, see ``pools``) and ended after its call has
replied: :class:`Forked` is the process between those two moments, and ``sandbox`` runs calls in
it under a memory limit.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import psutil

from sluice.errors import SandboxDied
from sluice.workers.remote.template import Template, TemplateGone, Templates
from sluice.workers.watchdog import kill_tree


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
    def start(cls, env: Path | None, templates: Templates) -> Forked:
        """Fork one from the template of ``env`` in ``templates``, starting that template (again, if it had gone)."""
        workdir = tempfile.TemporaryDirectory(prefix="sluice-sandbox-")
        (requests_read, requests_write), (replies_read, replies_write), (output_read, output_write) = (
            os.pipe(),
            os.pipe(),
            os.pipe(),
        )
        theirs = (requests_read, replies_write, output_write)
        try:
            for last_try in (False, True):
                template = templates.get(env)
                try:
                    pid = template.fork(workdir.name, theirs)
                    break
                except TemplateGone as gone:
                    templates.forget(env)
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
