"""A sandbox: a fresh process, forked from a warm template, that runs remote calls under a
memory limit that grows.

The limit starts at the call's ``memory``. A monitor thread reads the sandbox's resident memory
(with its children) every few milliseconds: past ``threshold`` of the limit, the limit grows by
``factor`` up to ``ceiling``; past the limit, the sandbox is killed. A call whose sandbox dies
ends without a complete reply, which is what :class:`SandboxDied` reports.

The process itself is a :class:`~sluice.workers.remote.forked.Forked`, taken from ``pools`` (the
spare forked ahead of the call, else a new one from the pool process's template; see
``template`` and ``sandbox_main``) and, with ``close_later``, left there to be ended after the
call's result is stored.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from sluice.errors import SandboxDied
from sluice.units import format_size
from sluice.workers.remote import sandbox_main
from sluice.workers.remote.pools import close_retired, fork, retire, take_spare
from sluice.workers.watchdog import ProcessTree, kill_tree


class Sandbox:
    """Use as a context manager; :meth:`call` runs one pickled call and returns the pickled reply.
    With ``close_later`` a block that ends without an exception retires the sandbox instead of
    ending it (see :func:`~sluice.workers.remote.pools.close_retired`)."""

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
        self.forked = take_spare(self.env) or fork(self.env)
        self._threads = [
            threading.Thread(target=self._read_output, daemon=True, name="sluice-sandbox-output"),
            threading.Thread(target=self._monitor, daemon=True, name="sluice-sandbox-memory"),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.close_later and kind is None:
            retire(self)
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
