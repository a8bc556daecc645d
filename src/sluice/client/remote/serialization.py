"""How a remote call's function, arguments and value travel: cloudpickle, checked before sending.

Objects tied to a live local resource (open files, sockets, locks, threads, database
connections, subprocesses) cannot mean anything on another machine. Pickle would fail on some
of them deep inside with a message about ``_thread.lock``; we stop at the first one and name it.
"""

from __future__ import annotations

import dis
import io
import mmap
import pickle
import selectors
import socket
import sqlite3
import subprocess
import threading
import types
from collections.abc import Iterator
from typing import Any

import cloudpickle

from sluice.errors import SerializationError

#: Types that hold a live local resource, with the words a user recognises them by.
LIVE_RESOURCES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (io.IOBase, "an open file or stream"),
    (socket.socket, "a socket"),
    (
        (
            type(threading.Lock()),
            type(threading.RLock()),
            threading.Condition,
            threading.Semaphore,
            threading.Event,
            threading.Barrier,
        ),
        "a lock or synchronization primitive",
    ),
    (threading.Thread, "a thread"),
    ((sqlite3.Connection, sqlite3.Cursor), "a database connection"),
    (subprocess.Popen, "a running subprocess"),
    (selectors.BaseSelector, "a selector"),
    (mmap.mmap, "a memory map"),
)
#: Database drivers (top-level packages) and the class-name endings of their connection objects.
DRIVER_PACKAGES = frozenset({"psycopg", "psycopg2", "pymysql", "MySQLdb", "redis", "pymongo", "sqlalchemy"})
DRIVER_CONNECTIONS = ("Connection", "ConnectionPool", "Redis")

HOW_TO_FIX = "objects tied to a live local resource cannot be sent; create it inside the function instead"


def live_resource(obj: object) -> str | None:
    """What kind of live resource ``obj`` is, or None when it is an ordinary value."""
    for kinds, words in LIVE_RESOURCES:
        if isinstance(obj, kinds):
            return words
    cls = type(obj)
    if (cls.__module__ or "").partition(".")[0] in DRIVER_PACKAGES and cls.__name__.endswith(DRIVER_CONNECTIONS):
        return "a database connection"
    return None


class _CheckingPickler(cloudpickle.Pickler):
    """cloudpickle's pickler that refuses live resources by name before pickling them."""

    def reducer_override(self, obj: Any) -> Any:
        words = live_resource(obj)
        if words is not None:
            raise SerializationError(f"cannot send {_short_repr(obj)} ({words}) to a remote worker: {HOW_TO_FIX}")
        return super().reducer_override(obj)


def dumps(obj: Any, what: str = "value") -> bytes:
    """cloudpickle ``obj``; anything that cannot travel raises :class:`SerializationError`."""
    buffer = io.BytesIO()
    try:
        _CheckingPickler(buffer, protocol=pickle.DEFAULT_PROTOCOL).dump(obj)
    except SerializationError as exc:
        raise SerializationError(f"{what}: {exc}") from None
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
        raise SerializationError(f"{what} cannot be pickled: {exc}; {HOW_TO_FIX}") from None
    return buffer.getvalue()


def pack_call(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """Pickle one call; when it cannot travel, the error names the part (function or argument)."""
    try:
        return dumps((function, args, kwargs), "the call")
    except SerializationError:
        dumps(function, "the function")
        for index, value in enumerate(args, 1):
            dumps(value, f"argument {index}")
        for name, value in kwargs.items():
            dumps(value, f"keyword argument {name!r}")
        raise


def loads(data: bytes) -> Any:
    return cloudpickle.loads(data)


def _short_repr(obj: object, limit: int = 120) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def import_hints(function: Any) -> list[str]:
    """Top-level modules the function imports or uses (as globals or closure variables): sent so
    workers can say early what they lack."""
    code = getattr(function, "__code__", None)
    if code is None:
        return []
    names: set[str] = set()
    for cell in getattr(function, "__closure__", None) or ():
        try:
            if isinstance(cell.cell_contents, types.ModuleType):
                names.add(cell.cell_contents.__name__.split(".")[0])
        except ValueError:  # an empty cell
            continue
    for each in _code_objects(code):
        for instruction in dis.get_instructions(each):
            if instruction.opname == "IMPORT_NAME" and instruction.argval:
                names.add(str(instruction.argval).split(".")[0])
        for global_name in each.co_names:
            value = getattr(function, "__globals__", {}).get(global_name)
            if isinstance(value, types.ModuleType):
                names.add(value.__name__.split(".")[0])
    return sorted(names)


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)
