"""Which resource classes take remote calls, and the one a call of a given size goes to: the
client routes by it and the worker re-routes a retry by it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice.compute import Compute
from sluice.queues.catalog import Catalog, ResourceClass
from sluice.tasks.remote.settings import check_classes, remote_settings

if TYPE_CHECKING:
    from sluice.app import App


def remote_catalog(app: App) -> Catalog:
    """The classes configured to run remote calls (``remote_classes``; default: all of them)."""
    names = remote_settings(app).remote_classes
    if names is None:
        return app.catalog
    check_classes(names, app.catalog)  # checked at load against the configured catalog; App(classes=) may differ
    return Catalog(app.catalog.get(n) for n in names)


def remote_class(app: App, memory: int, gpu: bool, what: str) -> ResourceClass:
    """The smallest remote class whose slot holds ``memory`` (and a GPU when asked)."""
    return remote_catalog(app).route(Compute.of(memory_bytes=memory, gpu=1 if gpu else None), what)
