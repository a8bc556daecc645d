"""The sandbox process: unpickle a call, run it, send back one complete reply per call.

Sandboxes are forked from a **template**: a Python process started once per package
environment (``python sandbox_main.py ENV_DIR CONTROL_FD``) that has imported
cloudpickle, put the environment on ``sys.path`` and then only waits. For each call the worker
sends it three pipe ends over the control socket; the template forks, and the child, a fresh
process that has run nothing yet, serves the call on those pipes. A fork costs about a
millisecond where a new interpreter costs tens. The file is run by path, not with ``-m``, so
that neither the template nor a sandbox imports anything of sluice or Celery.
(``multiprocessing``'s forkserver does not fit: one per process, and each child re-imports the
parent's main module and unpickles a process object.)

Protocol. Control socket (SOCK_SEQPACKET), worker to template: one message per sandbox, the
sandbox's working directory as UTF-8 with the requests, replies and output pipe ends attached;
template to worker: NOTICE records, ``P pid`` when a sandbox was forked and ``X pid code``
when it ended (code as ``subprocess`` reports it: negative for a signal). Requests arrive on
the requests pipe and replies leave on the replies pipe, each as an 8-byte big-endian length
and then that many bytes of cloudpickle. The function's own stdout and stderr go to the output
pipe; after each call the sandbox prints END_OF_CALL so the worker knows the call's output is
complete. A sandbox that dies mid-call (a memory kill) leaves no complete reply, which is how
the worker tells.
"""

from __future__ import annotations

import ctypes
import dis
import os
import select
import signal
import socket
import struct
import sys
import traceback
import types
from typing import IO, NoReturn

import cloudpickle

FRAME = struct.Struct(">Q")
#: A template's notice to the worker: kind (b"P" forked, b"X" ended), pid, exit code.
NOTICE = struct.Struct(">cii")
END_OF_CALL = "\x1esluice-end-of-call\x1e"


def write_frame(stream: IO[bytes], data: bytes) -> None:
    stream.write(FRAME.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes]) -> bytes | None:
    """One frame, or None when the stream ended before a complete frame."""
    header = stream.read(FRAME.size)
    if len(header) < FRAME.size:
        return None
    (size,) = FRAME.unpack(header)
    data = stream.read(size)
    return data if len(data) == size else None


#: Globals that functions sent by value assigned (``global n; n += 1``), per client module: a
#: by-value function arrives with a fresh copy of its globals, so without this a session would
#: forget them between calls. Functions from importable modules keep their module's state anyway.
_assigned_globals: dict[str, dict[str, object]] = {}


def _call(function: object, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
    module = sys.modules.get(getattr(function, "__module__", "") or "")
    if not isinstance(function, types.FunctionType) or (module and function.__globals__ is vars(module)):
        return function(*args, **kwargs)  # type: ignore[operator]
    kept = _assigned_globals.setdefault(function.__module__, {})
    function.__globals__.update(kept)
    try:
        return function(*args, **kwargs)
    finally:
        for instruction in dis.get_instructions(function):
            if instruction.opname == "STORE_GLOBAL":
                kept[instruction.argval] = function.__globals__.get(instruction.argval)


def run_one(frame: bytes) -> bytes:
    """Run one pickled ``(function, args, kwargs)``; reply ``("ok", value)`` or ``("err", ...)``."""
    try:
        function, args, kwargs = cloudpickle.loads(frame)
        return cloudpickle.dumps(("ok", _call(function, args, kwargs)))
    except BaseException as exc:  # noqa: BLE001 - the caller gets every exception, as data
        text = traceback.format_exc()
        try:
            return cloudpickle.dumps(("err", exc, text))
        except Exception:  # noqa: BLE001 - an exception that does not pickle travels as text
            return cloudpickle.dumps(("err", None, f"{type(exc).__qualname__}: {exc}", text))


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """Answer calls until the requests pipe ends."""
    while (frame := read_frame(requests)) is not None:
        reply = run_one(frame)
        sys.stderr.flush()
        print(END_OF_CALL, flush=True)
        write_frame(replies, reply)


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not Linux: a sandbox outlives a killed template until stopped by hand
        return None


#: Loaded once in the template, so a sandbox only makes the call.
_LIBC = _libc()


def _die_with_parent() -> None:
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: cleared by fork, so set in each sandbox


def _sandbox(workdir: str, requests_fd: int, replies_fd: int, output_fd: int) -> NoReturn:
    """In the forked child: become the call's sandbox and serve it."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _die_with_parent()
    os.chdir(workdir)
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    os.close(output_fd)
    code = 0
    try:
        serve(os.fdopen(requests_fd, "rb"), os.fdopen(replies_fd, "wb"))
    except BaseException:  # noqa: BLE001 - a broken pipe to a gone worker: nothing left to tell
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _report_exits(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(NOTICE.pack(b"X", pid, os.waitstatus_to_exitcode(status)))


def template(env_dir: str, control_fd: int) -> None:
    """Fork a sandbox for each message on the control socket, until the worker closes it."""
    if env_dir:
        sys.path.append(env_dir)  # after site-packages: the base environment wins
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a function reading stdin reads nothing, as in a fresh process
    os.close(devnull)
    control = socket.socket(fileno=control_fd)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    watched: list[socket.socket | int] = [control, wake_read]  # the control socket and the wake-up pipe's fd
    while True:
        ready, _, _ = select.select(watched, [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
            _report_exits(control)
        if control in ready:
            message, fds, _, _ = socket.recv_fds(control, 4096, 3)
            if not message:
                return  # the worker closed its end (or died): so do its sandboxes' template
            pid = os.fork()
            if pid == 0:
                control.close()
                os.close(wake_read)
                os.close(wake_write)
                _sandbox(message.decode(), *fds)
            for fd in fds:
                os.close(fd)
            control.send(NOTICE.pack(b"P", pid, 0))


if __name__ == "__main__":
    sys.path.pop(0)  # this file's directory: its neighbours must not shadow the function's imports
    template(sys.argv[1], int(sys.argv[2]))
