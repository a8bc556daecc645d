"""A queue's bell, written once: a Redis list of tokens, one pushed with every publish, that an
idle worker blocks on (``BRPOP``) before it fetches, since a Lua script cannot block.

A publish only pushes its token; the fetch that takes a message spends one and trims the bell to
:data:`BELL_CAP` (``fetch.lua``), and so does a forward (``forward.lua``), which rings the target
queue's bell as a publish would; a test holds the tokens the scripts push and their cap equal
to these.
"""

from __future__ import annotations

from typing import Any

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
