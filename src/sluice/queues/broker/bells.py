"""A queue's bell, written once: a Redis list of tokens, one pushed with every publish, that an
idle worker blocks on (``BRPOP``) before it fetches, since a Lua script cannot block.

A publish only pushes its token; the fetch that takes a message spends one and trims the bell to
:data:`BELL_CAP` (``fetch.lua``), and so does a forward (``forward.lua``), which rings the target
queue's bell as a publish would; a test holds the tokens the scripts push and their cap equal
to these.

A tenant's queue (``sluice.tenants``) has no bell of its own: a message for it rings its class's
bell, which the class's workers wait on, and lists the tenant in the class's tenant set
(:func:`announce`), where the fetch script finds the tenant lines to choose from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice import keys
from sluice.tenants import DEFAULT_TENANT, split_queue

#: The most bell tokens a served queue keeps: enough to wake every idle worker of a class at
#: once. A publish only pushes its token; each fetch trims (``fetch.lua``).
BELL_CAP = 1000
#: What one ring pushes: a token's value carries nothing; waking is what it is for.
TOKEN = 1


def ring(pipe: Any, key: str) -> Any:
    """Add one token to the bell ``key`` (untrimmed: the fetch trims); returns the pipeline."""
    return pipe.lpush(key, TOKEN)


def ring_times(pipe: Any, key: str, count: int) -> Any:
    """Add ``count`` tokens to the bell ``key`` (at most the cap) and trim it to the cap: the
    same idle workers wake as ``count`` rings would wake. Returns the pipeline."""
    return pipe.lpush(key, *[TOKEN] * min(count, BELL_CAP)).ltrim(key, 0, BELL_CAP - 1)


def announce(pipe: Any, queue: str, count: int = 1, named: Callable[[str], str] = str) -> Any:
    """Ring for ``count`` messages pushed to ``queue`` (a tenant's queue rings its class's bell
    and lists the tenant in the class's tenant set, after the push: the fetch script forgets a
    listed tenant whose lines it finds empty). ``named``: the full name of a key (a client that
    adds no prefix). Returns the pipeline."""
    queue, tenant = split_queue(queue)
    bell = named(keys.bell(queue))
    (ring(pipe, bell) if count == 1 else ring_times(pipe, bell, count))
    if tenant != DEFAULT_TENANT:
        pipe.sadd(named(keys.tenant_lines(queue)), tenant)
    return pipe
