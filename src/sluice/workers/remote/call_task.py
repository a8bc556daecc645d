"""The worker side of a remote call: check it, prepare its packages, run it in a sandbox.

Order matters for safety: the signature and the Python version are checked, and the queue is
checked to be one that takes remote calls, before any byte of the payload is unpickled (the
payload is only ever unpickled inside the sandbox).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from celery.exceptions import Retry

from sluice import keys
from sluice.compute import Compute
from sluice.errors import InvalidRequestError, MemoryExhausted, SandboxDied
from sluice.headers import Headers
from sluice.keys import SessionPart
from sluice.queues.broker.layout import worker_queue
from sluice.signing import seal, unseal
from sluice.tasks.escalation import Attempt
from sluice.tasks.remote.call import Call, Reply, python_version
from sluice.tasks.remote.classes import remote_catalog, remote_class
from sluice.tasks.remote.packages import normalize_packages, plan_install
from sluice.tasks.remote.session import SessionCall, SessionReply
from sluice.tasks.remote.settings import RemoteSettings, remote_settings
from sluice.units import format_size
from sluice.workers.gpu import gpu_memory
from sluice.workers.remote.package_envs import EnvironmentCache, base_distributions
from sluice.workers.remote.pools import forget_template
from sluice.workers.remote.sandbox import Sandbox

log = logging.getLogger("sluice.remote")

OUTPUT_TTL = 3600
#: Kept free between a sandbox's ceiling and the slot, so the sandbox monitor acts before the
#: worker's watchdog would kill the whole pool process (which measures the two together).
WATCHDOG_MARGIN = 32 << 20


@dataclass
class CallOutput:
    """The call's output lines, kept for the reply and pushed to Redis when the caller streams."""

    client: Any
    key: str
    stream: bool
    lines: list[str] = field(default_factory=list)

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self.stream:
            self.client.pipeline().rpush(self.key, line).expire(self.key, OUTPUT_TTL).execute()

    def take(self) -> list[str]:
        """The lines so far, forgetting them (a session replies with each call's own lines)."""
        lines, self.lines = self.lines, []
        return lines


def accepts_remote(app: Any, routing_key: str, hostname: str | None) -> bool:
    """Whether a message delivered on ``routing_key`` may run a remote call on this worker: a
    remote class's queue, or this worker's own direct queue when it serves a remote class."""
    catalog = remote_catalog(app)
    if routing_key in catalog:
        return True
    if hostname and routing_key == worker_queue(hostname).name:
        consumed = app.amqp.queues.consume_from or {}
        return any(name in catalog for name in consumed)
    return False


def check_call(app: Any, request: Any, call: object) -> Call:
    """The call once its signature, Python version, queue and GPU memory are acceptable."""
    fields = unseal(app.settings.signing_secret(), call)
    if fields.get("python") != python_version():
        raise InvalidRequestError(
            f"refusing remote call {fields.get('function')}: the client runs Python {fields.get('python')} and this "
            f"worker runs Python {python_version()}; cloudpickle needs the same major.minor on both sides "
            f"(use a worker image with Python {fields.get('python')}, or call from Python {python_version()})"
        )
    queue = (request.delivery_info or {}).get("routing_key") or ""
    if not accepts_remote(app, queue, app.node_name(request)):
        raise InvalidRequestError(
            f"refusing remote call {fields.get('function')} on queue {queue!r}: it does not take "
            f"remote calls (remote_classes: {remote_settings(app).remote_classes or 'all classes'})"
        )
    wanted = fields.get("gpu_memory")
    have = gpu_memory() if wanted else None  # nvidia-smi only for the calls that reserve GPU memory
    if wanted and have is not None and have < wanted:
        raise InvalidRequestError(
            f"refusing remote call {fields.get('function')}: it reserves {format_size(wanted)} "
            f"of GPU memory and this worker's GPU has {format_size(have)}"
        )
    return Call.decode(fields)


@dataclass(frozen=True)
class Room:
    """How big a sandbox may start and grow on this worker."""

    start: int
    hard_max: int  #: the call's max_memory, else a share of the slot
    here: int  #: what this worker's slot has left beside the pool process

    @property
    def ceiling(self) -> int:
        return min(self.hard_max, self.here)


@contextmanager
def prepared(task: Any, call: Call, output: CallOutput) -> Iterator[tuple[Path | None, Room]]:
    """Validate the package list again, report what the base image provides, and yield the
    environment (installed or cached) and the room for the sandbox."""
    request, settings = task.request, remote_settings(task.app)
    packages = normalize_packages(call.packages)
    plan = plan_install(packages, base_distributions())
    for line in plan.ignored:
        output(line)
    if not plan.install:
        for module in call.hints:
            if importlib.util.find_spec(module) is None:
                output(f"sluice: the function imports {module}, which this worker does not have; list it in packages=")
    slot = Attempt.of(task, request, request.delivery_info).compute.memory_bytes or call.memory
    room = Room(
        Headers.read(request).remote_start or call.memory,
        call.max_memory or int(slot * settings.remote_memory_share),
        slot - psutil.Process().memory_info().rss - WATCHDOG_MARGIN,
    )
    cache = EnvironmentCache(settings.envs_path, settings.env_cache_size, settings.fresh_env_per_call)
    with cache.environment(plan, output) as env:
        if env is not None:
            cache.remember(packages, plan)
        try:
            yield env, room
        finally:
            if env is not None and settings.fresh_env_per_call:
                forget_template(env)  # the environment is removed next, so is its template


def sandbox(
    env: Path | None, start: int, room: Room, settings: RemoteSettings, output: CallOutput, close_later: bool = False
) -> Sandbox:
    return Sandbox(
        env,
        start,
        room.ceiling,
        output,
        settings.remote_growth_threshold,
        settings.remote_growth_factor,
        close_later=close_later,
    )


def run_remote(task: Any, message: dict[str, Any]) -> dict[str, Any]:
    """Bound Celery task body (registered by every sluice App under ``REMOTE_TASK``)."""
    app, request, settings = task.app, task.request, remote_settings(task.app)
    call = check_call(app, request, message)
    output = CallOutput(app.redis, keys.remote_output(request.id), call.stream)
    headers = Headers.read(request)
    attempt = headers.attempt
    if attempt > 1:
        output(
            f"sluice: retry (attempt 2 of 2) in a fresh sandbox: the previous attempt's sandbox "
            f"{headers.remote_reason or 'ended without a complete response'}"
        )
    with prepared(task, call, output) as (env, room):
        start = room.start
        while True:
            try:
                with sandbox(env, start, room, settings, output, close_later=True) as box:
                    reply = box.call(call.payload)
                return seal(
                    app.settings.signing_secret(),
                    Reply(reply, output.lines, box.limits, attempt, app.node_name(request)).encode(),
                )
            except SandboxDied as died:
                if attempt >= 2:
                    raise MemoryExhausted(
                        f"remote call {call.function} ended without a complete response twice; last: the sandbox "
                        f"{died}. Raise memory=/max_memory= (now {format_size(call.memory)}/"
                        f"{format_size(room.hard_max)}), or make the function use less\n" + "\n".join(output.lines)
                    ) from None
                attempt, start = 2, min(int((died.killed_at or start) * settings.remote_growth_factor), room.hard_max)
                if start > room.here:
                    _republish(task, call, start, str(died))
                output(
                    f"sluice: retrying once (attempt 2 of 2) in a fresh sandbox at {format_size(start)}: "
                    f"the sandbox {died}"
                )


def run_session(task: Any, message: dict[str, Any]) -> dict[str, Any]:
    """Bound Celery task body for ``SESSION_TASK``: one sandbox serving a session's calls until the
    client closes it or its lease expires. A sandbox that dies ends the session (never retried)."""
    app, request, settings = task.app, task.request, remote_settings(task.app)
    call = check_call(app, request, message)
    secret, session = app.settings.signing_secret(), str(call.session)
    calls, replies, lease = (
        keys.session(session, part) for part in (SessionPart.CALLS, SessionPart.REPLIES, SessionPart.LEASE)
    )
    output = CallOutput(app.redis, keys.remote_output(request.id), False)
    served = 0
    with prepared(task, call, output) as (env, room), sandbox(env, room.start, room, settings, output) as box:
        while app.redis.exists(lease):
            item = app.redis.blpop([calls], timeout=1)
            if item is None:
                continue
            sent = SessionCall.decode(unseal(secret, json.loads(item[1]), f"a call of session {session}"), session)
            if sent.close:
                return {"session": session, "calls": served, "ended": "closed by the client"}
            payload, error, memory = None, None, False
            try:
                payload = box.call(sent.payload)
            except SandboxDied as died:
                error = (
                    f"session {session}: the sandbox {died}; calls in a session are never retried "
                    "(a new sandbox would lose the session's state), and the session has ended"
                )
                memory = died.memory
            served += 1
            reply = SessionReply(
                session, sent.n, app.node_name(request), output.take(), box.limits, payload, error, memory
            )
            app.redis.rpush(replies, json.dumps(seal(secret, reply.encode())))
            if error is not None:
                return {"session": session, "calls": served, "ended": error}
    return {"session": session, "calls": served, "ended": "lease expired (the client went away)"}


def _republish(task: Any, call: Call, start: int, reason: str) -> None:
    """Send the retry to a class whose slot holds ``start``: this worker cannot."""
    request = task.request
    target = remote_class(task.app, start, call.gpu, call.function)
    slot = Compute.of(memory_bytes=target.slot.memory_bytes, gpu=target.slot.gpu)
    headers = {**(request.headers or {}), **Headers(2, slot, remote_start=start, remote_reason=reason).encode()}
    task.signature_from_request(request, queue=target.name, headers=headers).apply_async()
    line = (
        f"remote call {call.function}[{request.id}]: the sandbox {reason}; retrying once at "
        f"{format_size(start)} on {target.name} (attempt 2 of 2)"
    )
    log.warning(line)
    raise Retry(line)
