"""Client side of remote functions: ``@sluice.remote``, sessions, and the call's wire pieces
(packages, serialization, signing, routing, settings) that workers check again."""

from sluice.client.remote.function import remote
from sluice.client.remote.session import session

__all__ = ["remote", "session"]
