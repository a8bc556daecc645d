"""Client side of remote functions: ``@sluice.remote``, sessions, serialization and the routing
of calls (what the worker checks again lives in :mod:`sluice.tasks.remote`)."""

from sluice.client.remote.function import remote
from sluice.client.remote.session import session

__all__ = ["remote", "session"]
