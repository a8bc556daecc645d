"""The one registry of sluice's Lua scripts: each ``lua/<name>.lua`` beside this module is read
and hashed once per process, and this is the only place that loads one into Redis.

A script runs by its SHA (``EVALSHA``); a Redis that does not know it yet (new, restarted, or
flushed) answers NOSCRIPT, and the script is loaded once and run again, as redis-py's own
``Script`` does. Callers name a script; none holds its text or registers it on a client.

A script shares functions with others by a line ``-- include <name>.lua``, replaced by that
file's text (Redis runs each script alone: what two scripts both do is written once there).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis
from redis.exceptions import NoScriptError

_INCLUDE = re.compile(r"^-- include (\w+)\.lua$", re.MULTILINE)


@functools.cache
def source(name: str) -> str:
    """The text of ``lua/<name>.lua`` with its includes in place (read once)."""
    text = resources.files(__package__).joinpath("lua", f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda match: source(match.group(1)), text)


@functools.cache
def sha(name: str) -> str:
    """The SHA-1 Redis knows ``lua/<name>.lua`` by, for ``EVALSHA``."""
    return hashlib.sha1(source(name).encode()).hexdigest()


def load(client: redis.Redis, name: str) -> None:
    """Load ``lua/<name>.lua`` into ``client``'s Redis (after it answered NOSCRIPT)."""
    client.script_load(source(name))


def queue(pipe: redis.client.Pipeline, name: str, keys: Sequence[Any], args: Sequence[Any]) -> None:
    """Add a run of ``lua/<name>.lua`` to a pipeline (by its text: a pipeline cannot load it
    after a NOSCRIPT answer); for the rare paths that hold a message in a transaction."""
    pipe.eval(source(name), len(keys), *keys, *args)


def run(client: redis.Redis, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """Run ``lua/<name>.lua`` on ``keys`` and ``args``; loaded first if Redis does not know it."""
    try:
        return client.evalsha(sha(name), len(keys), *keys, *args)
    except NoScriptError:
        load(client, name)
        return client.evalsha(sha(name), len(keys), *keys, *args)
