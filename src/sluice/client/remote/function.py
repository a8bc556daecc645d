"""``@sluice.remote``: run a function on a worker, in a sandbox, with the packages it needs.

Everything that can be checked on the client is checked when the function is decorated (the
package list, the sizes) or before anything is sent (that the call pickles); the call then
travels as a signed JSON message (see :mod:`sluice.signing`) routed by its memory and
gpu to the smallest class that takes remote calls.
"""

from __future__ import annotations

import contextvars
import functools
import linecache
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import AsyncResult

from sluice import keys
from sluice.app import App
from sluice.client.remote.routing import choose_target
from sluice.client.remote.serialization import import_hints, loads, pack_call
from sluice.compute import Compute
from sluice.errors import CallTimeout, ConfigurationError, RemoteError
from sluice.headers import Headers
from sluice.signing import seal, unseal
from sluice.tasks.remote.call import REMOTE_TASK, Call, Reply, python_version
from sluice.tasks.remote.packages import environment_key, normalize_packages
from sluice.tasks.remote.settings import remote_settings
from sluice.tenants import check_tenant
from sluice.units import format_size, parse_size

P = ParamSpec("P")
R = TypeVar("R")


#: The session of the innermost ``with sluice.session(...)`` block, if any (set by the session).
active_session: contextvars.ContextVar[Any] = contextvars.ContextVar("sluice_session", default=None)


@dataclass(frozen=True)
class Budget:
    """A remote function's sizes, in bytes; ``memory`` None means the operator's default."""

    memory: int | None = None
    max_memory: int | None = None
    gpu: bool = False
    gpu_memory: int | None = None
    max_gpu_memory: int | None = None

    @classmethod
    def of(
        cls,
        name: str,
        memory: object = None,
        max_memory: object = None,
        gpu: object = None,
        gpu_memory: object = None,
        max_gpu_memory: object = None,
    ) -> Budget:
        """Validate the keywords of ``@remote`` (sizes as in the Units table of the docs)."""
        sizes = {
            key: None if value is None else parse_size(value, f"{name}: {key}")
            for key, value in (
                ("memory", memory),
                ("max_memory", max_memory),
                ("gpu_memory", gpu_memory),
                ("max_gpu_memory", max_gpu_memory),
            )
        }
        for key, size in sizes.items():
            if size == 0:
                raise ConfigurationError(f'{name}: {key}=0 must be a size greater than zero, e.g. "512Mi"')
        for start, ceiling in (("memory", "max_memory"), ("gpu_memory", "max_gpu_memory")):
            low, high = sizes[start], sizes[ceiling]
            if low is not None and high is not None and high < low:
                raise ConfigurationError(
                    f"{name}: {ceiling}={format_size(high)} is below {start}={format_size(low)}; "
                    f"a ceiling must be at least its starting value"
                )
        if gpu is not None and not isinstance(gpu, bool):
            raise ConfigurationError(f"{name}: gpu={gpu!r} must be True or False")
        wants_gpu_memory = sizes["gpu_memory"] is not None or sizes["max_gpu_memory"] is not None
        if gpu is False and wants_gpu_memory:
            raise ConfigurationError(f"{name}: gpu=False contradicts gpu_memory=; gpu_memory implies gpu=True")
        return cls(
            sizes["memory"],
            sizes["max_memory"],
            bool(gpu) or wants_gpu_memory,
            sizes["gpu_memory"],
            sizes["max_gpu_memory"],
        )

    def start(self, default: int) -> int:
        """The memory a call starts with: its own, else the default (never above its ceiling)."""
        if self.memory is not None:
            return self.memory
        return min(default, self.max_memory) if self.max_memory is not None else default


class RemoteFunction(Generic[P, R]):
    """A decorated function: call it, ``.spawn()``/``.delay()`` it, or ``.map()`` it over items."""

    def __init__(
        self,
        function: Callable[P, R],
        packages: tuple[str, ...],
        budget: Budget,
        app: Any = None,
        tenant: str | None = None,
    ) -> None:
        functools.update_wrapper(self, function)
        self.function = function
        self.tenant = tenant  #: whose calls these are (None: as any call finds its tenant, sluice.tenants)
        self.packages = packages
        self.budget = budget
        self.app = app
        self.name = f"{function.__module__}.{function.__qualname__}"
        self.hints = import_hints(function)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        session = active_session.get()
        if session is not None:
            return session.call(self, *args, **kwargs)
        return self.spawn(*args, **kwargs).get()

    def spawn(self, *args: P.args, **kwargs: P.kwargs) -> RemoteCall[R]:
        """Send the call and return at once with a handle; ``.get(timeout=)`` waits for the value."""
        settings = remote_settings(self.app or App.default())
        payload = pack_call(self.function, args, kwargs)
        start = self.budget.start(settings.remote_memory)
        return self.send(REMOTE_TASK, self.fields(payload, start, settings.stream_logs), start)

    def send(self, task_name: str, fields: dict[str, Any], start: int) -> RemoteCall[Any]:
        """Sign ``fields`` and publish them to the queue :func:`choose_target` picks."""
        app = self.app or App.default()
        target = choose_target(
            app,
            start,
            self.budget.gpu,
            self.budget.gpu_memory,
            environment_key(self.packages) if self.packages else None,
            self.name,
        )
        message = seal(app.settings.signing_secret(), fields)
        slot = Compute.of(memory_bytes=target.resource_class.slot.memory_bytes, gpu=target.resource_class.slot.gpu)
        # to a worker's own queue: if that worker dies first, the reaper moves the call home
        home = target.resource_class.name if target.worker is not None else None
        headers = Headers(compute=slot, sticky=home).encode()
        tenant = {} if self.tenant is None else {"tenant": self.tenant}
        result = app.send_task(
            task_name,
            args=[message],
            queue=target.queue,
            headers=headers,
            argsrepr=f"({self.name})",  # Flower shows the name, not the payload
            kwargsrepr="{}",
            **tenant,
        )
        return RemoteCall(result, self.name, app, bool(fields.get("stream")), source_file(self.function))

    delay = spawn

    def call(self, payload: bytes, start: int, stream: bool) -> Call:
        """The call a message carries: this function's name, packages and sizes, and ``payload``."""
        budget = self.budget
        return Call(
            self.name,
            python_version(),
            self.packages,
            start,
            payload,
            tuple(self.hints),
            budget.max_memory,
            budget.gpu,
            budget.gpu_memory,
            budget.max_gpu_memory,
            stream,
        )

    def fields(self, payload: bytes, start: int, stream: bool) -> dict[str, Any]:
        """The message's fields (all signed)."""
        return self.call(payload, start, stream).encode()

    def map(self, items: Iterable[Any], timeout: float | None = None) -> list[R]:
        """Call the function once per item, all at once; values in the order of the items."""
        spawn: Callable[..., RemoteCall[R]] = self.spawn  # each item is the one argument: P cannot say so
        calls = [spawn(item) for item in items]
        deadline = None if timeout is None else time.monotonic() + timeout
        return [call.get(None if deadline is None else max(0.0, deadline - time.monotonic())) for call in calls]


class RemoteCall(Generic[R]):
    """A call in flight. After :meth:`get`: ``output`` (its lines), ``limits`` (the memory limits
    its sandbox went through), ``attempt`` and ``worker``."""

    def __init__(self, result: AsyncResult, name: str, app: Any, stream: bool, source: str | None = None) -> None:
        self.result = result
        self.name = name
        self.source = source
        self.app = app
        self.stream = stream
        self.output: list[str] = []
        self.limits: list[int] = []
        self.attempt = 0
        self.worker: str | None = None
        self._streamed = 0

    @property
    def id(self) -> str:
        return str(self.result.id)

    def get(self, timeout: float | None = None) -> R:
        """The function's value; its exception (remote traceback attached) if it raised."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise CallTimeout(f"remote call {self.name}[{self.id}] did not finish within {timeout}s")
            wait = remaining if not self.stream else 0.2 if remaining is None else min(0.2, remaining)
            try:
                reply = self.result.get(timeout=wait)
                break
            except CeleryTimeout:
                pass
            finally:
                self._print_new_output()
        return self._open(reply)

    def _print_new_output(self) -> None:
        if not self.stream:
            return
        lines = self.app.redis.lrange(keys.remote_output(self.id), self._streamed, -1)
        for line in lines:
            print(f"[{self.name}] {line.decode(errors='replace')}", file=sys.stderr, flush=True)
        self._streamed += len(lines)

    def _open(self, reply: Any) -> R:
        opened = Reply.decode(unseal(self.app.settings.signing_secret(), reply, f"the reply to {self.name}"))
        self.output, self.limits = opened.output, opened.limits
        self.attempt, self.worker = opened.attempt, opened.worker
        return open_reply(loads(opened.payload), self.worker, self.source)


def open_reply(outcome: tuple[Any, ...], worker: str | None, source: str | None = None) -> Any:
    """``("ok", value)`` -> value; ``("err", ...)`` -> raise the remote exception here, with the
    remote traceback attached (lines of code sent by value are shown from ``source``)."""
    if outcome[0] == "ok":
        return outcome[1]
    if outcome[1] is None:  # an exception that did not pickle: its text travelled instead
        raise RemoteError(f"{outcome[2]}\nremote traceback (worker {worker}):\n{localize(outcome[3], source)}")
    exc: BaseException = outcome[1]
    exc.add_note(f"remote traceback (worker {worker}):\n{localize(outcome[2], source)}")
    raise exc


_DYNAMIC_FRAME = re.compile(r'^  File "<dynamic-code>", line (\d+), in (.+)$')


def localize(traceback_text: str, source: str | None) -> str:
    """cloudpickle names code sent by value ``<dynamic-code>`` (line numbers are kept): name the
    caller's file instead and show the line, as a local traceback would."""
    if not source:
        return traceback_text
    lines = []
    for line in traceback_text.splitlines():
        match = _DYNAMIC_FRAME.match(line)
        code = linecache.getline(source, int(match[1])).strip() if match else ""
        lines.append(f'  File "{source}", line {match[1]}, in {match[2]}\n    {code}' if match and code else line)
    return "\n".join(lines)


def source_file(function: Any) -> str | None:
    """The file a function's code comes from (to show remote tracebacks of code sent by value)."""
    code = getattr(function, "__code__", None)
    return code.co_filename if code is not None else None


def remote(
    function: Callable[P, R] | None = None,
    *,
    packages: Iterable[str] | None = None,
    memory: int | str | None = None,
    max_memory: int | str | None = None,
    gpu: bool | None = None,
    gpu_memory: int | str | None = None,
    max_gpu_memory: int | str | None = None,
    app: Any = None,
    tenant: str | None = None,
) -> Any:
    """Decorate a function to run on a worker in a sandbox with ``packages`` installed.

    ``memory`` is the sandbox's starting limit (default: the ``remote_memory`` setting, 1Gi);
    it grows at 90% use up to ``max_memory``. ``gpu``/``gpu_memory`` send the call to a gpu
    class. ``tenant``: whose calls these are (default: as any call's, ``with sluice.tenant``
    or the App's). Everything is validated here, at decoration time.
    """

    def decorate(fn: Callable[P, R]) -> RemoteFunction[P, R]:
        name = f"{fn.__module__}.{fn.__qualname__}"
        budget = Budget.of(name, memory, max_memory, gpu, gpu_memory, max_gpu_memory)
        return RemoteFunction(
            fn, normalize_packages(packages), budget, app, None if tenant is None else check_tenant(tenant)
        )

    return decorate(function) if function is not None else decorate
