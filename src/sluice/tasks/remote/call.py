"""A remote call's contract: the names its tasks are registered under and the Python version the
client stamps on a call and the worker checks (cloudpickle needs the same major.minor)."""

from __future__ import annotations

import sys

#: A remote function's call: one signed call run in a fresh (or cached) sandbox.
REMOTE_TASK = "sluice.remote.call"
#: A session: one sandbox on one worker serving calls through Redis lists until it is closed.
SESSION_TASK = "sluice.remote.session"


def python_version() -> str:
    """major.minor: cloudpickle needs the same on both sides of a call."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"
