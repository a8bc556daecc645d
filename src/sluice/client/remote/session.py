"""``sluice.session()``: one sandbox on one worker kept for several calls, so state survives.

The session is a long task that holds a worker slot and a sandbox; calls reach it through a
Redis list and replies come back through another, each signed like any remote call. The client
keeps a lease alive while the block runs; when the block exits the session is closed, and when
the client disappears the lease expires and the worker ends the session by itself. A session's
calls are never retried on a memory kill: a fresh sandbox would have lost the session's state.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from sluice import keys
from sluice.app import App
from sluice.client.remote.function import (
    Budget,
    RemoteCall,
    RemoteFunction,
    active_session,
    open_reply,
    source_file,
)
from sluice.client.remote.serialization import loads, pack_call
from sluice.errors import ConfigurationError, MemoryKilled, SandboxCrashed, TaskFailed
from sluice.keys import SessionPart
from sluice.signing import seal, unseal
from sluice.tasks.remote.call import SESSION_TASK
from sluice.tasks.remote.packages import normalize_packages
from sluice.tasks.remote.session import SessionCall, SessionReply
from sluice.tasks.remote.settings import remote_settings

#: Seconds a session outlives its client's last sign of life.
LEASE_SECONDS = 10.0


class Session:
    """A live session: ``s.call(f, *args)``, or call remote functions inside the ``with`` block."""

    def __init__(self, packages: tuple[str, ...], budget: Budget, app: Any, lease: float) -> None:
        self.id = uuid.uuid4().hex
        self.packages = packages
        self.budget = budget
        self.app = app
        self.lease = lease
        self._numbers = itertools.count(1)
        self._stop = threading.Event()
        self.output: list[str] = []
        self.limits: list[int] = []

    def open(self) -> Session:
        self._renew()
        settings = remote_settings(self.app)
        start = self.budget.start(settings.remote_memory)
        probe = RemoteFunction(_session_marker, self.packages, self.budget, self.app)
        opening = replace(
            probe.call(b"", start, stream=False), function=f"session {self.id}", session=self.id, lease=self.lease
        )
        self.handle: RemoteCall[Any] = probe.send(SESSION_TASK, opening.encode(), start)
        threading.Thread(target=self._keep_alive, daemon=True, name=f"sluice-session-{self.id[:8]}").start()
        return self

    def call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` in the session's sandbox and return its value."""
        if isinstance(function, RemoteFunction):
            missing = set(normalize_packages([*self.packages, *function.packages])) - set(self.packages)
            if missing:
                raise ConfigurationError(
                    f"{function.name} needs {sorted(missing)}, which this session was not opened "
                    f"with (packages={list(self.packages)}); list them in sluice.session(packages=)"
                )
            function = function.function
        number = next(self._numbers)
        sent = SessionCall(self.id, number, pack_call(function, args, kwargs))
        message = seal(self.app.settings.signing_secret(), sent.encode())
        self.app.redis.rpush(keys.session(self.id, SessionPart.CALLS), json.dumps(message))
        reply = self._reply(number)
        self.output, self.limits = reply.output, reply.limits
        if reply.error is not None:
            raise (MemoryKilled if reply.memory else SandboxCrashed)(reply.error)
        return open_reply(loads(reply.payload or b""), reply.worker, source_file(function))

    def _reply(self, number: int) -> SessionReply:
        secret = self.app.settings.signing_secret()
        while True:
            item = self.app.redis.blpop([keys.session(self.id, SessionPart.REPLIES)], timeout=0.5)
            if item is not None:
                reply = SessionReply.decode(
                    unseal(secret, json.loads(item[1]), f"the session {self.id} reply"), self.id
                )
                if reply.n == number:
                    return reply
            elif self.handle.result.ready():
                ended = self.handle.result.get(timeout=1)  # raises the session's failure, if it failed
                raise TaskFailed(f"session {self.id} ended before replying to call {number}: {ended['ended']}")

    def close(self) -> None:
        self._stop.set()
        client = self.app.redis
        client.rpush(
            keys.session(self.id, SessionPart.CALLS),
            json.dumps(seal(self.app.settings.signing_secret(), SessionCall(self.id, close=True).encode())),
        )
        client.delete(keys.session(self.id, SessionPart.LEASE))
        try:
            self.handle.result.get(timeout=10)
        except Exception:  # noqa: BLE001 - closing must not mask the block's own outcome
            pass
        client.delete(keys.session(self.id, SessionPart.CALLS), keys.session(self.id, SessionPart.REPLIES))

    def _renew(self) -> None:
        self.app.redis.set(keys.session(self.id, SessionPart.LEASE), "1", px=int(self.lease * 1000))

    def _keep_alive(self) -> None:
        while not self._stop.wait(self.lease / 3):
            self._renew()


def _session_marker() -> None:
    """Stands in for a function when a session's first message is built (it carries none)."""


@contextmanager
def session(
    *,
    packages: Iterable[str] | None = None,
    memory: int | str | None = None,
    max_memory: int | str | None = None,
    gpu: bool | None = None,
    gpu_memory: int | str | None = None,
    app: Any = None,
    lease: float = LEASE_SECONDS,
) -> Iterator[Session]:
    """Keep one sandbox on one worker for the block; remote functions called inside run there."""
    budget = Budget.of("session", memory, max_memory, gpu, gpu_memory)
    live = Session(normalize_packages(packages), budget, app or App.default(), lease).open()
    token = active_session.set(live)
    try:
        yield live
    finally:
        active_session.reset(token)
        live.close()
