"""The sandbox process: unpickle a call, run it, send back one complete reply per call.

Run as a script by path (``python sandbox_main.py ENV_DIR REPLY_FD``), not with ``-m``, so that
starting a sandbox imports cloudpickle and nothing else of sluice or Celery: a sandbox is
started for every call (ahead of it, see ``warm_spare``) and must be cheap.

Protocol: requests arrive on stdin and replies leave on the file descriptor REPLY_FD, each as an
8-byte big-endian length and then that many bytes of cloudpickle. The function's own stdout
and stderr go to the worker line by line; after each call the sandbox prints END_OF_CALL so
the worker knows the call's output is complete. A sandbox that dies mid-call (a memory kill)
leaves no complete reply, which is how the worker tells.
"""

from __future__ import annotations

import dis
import os
import struct
import sys
import traceback
import types
from typing import IO

import cloudpickle

FRAME = struct.Struct(">Q")
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


def main(argv: list[str]) -> None:
    env_dir, reply_fd = argv[1], int(argv[2])
    if env_dir:
        sys.path.append(env_dir)  # after site-packages: the base environment wins
    requests = os.fdopen(os.dup(0), "rb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the function reading stdin must not read the protocol
    replies = os.fdopen(reply_fd, "wb")
    while (frame := read_frame(requests)) is not None:
        reply = run_one(frame)
        sys.stderr.flush()
        print(END_OF_CALL, flush=True)
        write_frame(replies, reply)


if __name__ == "__main__":
    sys.path.pop(0)  # this file's directory: its neighbours must not shadow the function's imports
    main(sys.argv)

