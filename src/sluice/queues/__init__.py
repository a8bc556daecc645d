"""Resource classes (the queues): the catalog (``catalog``), the Celery router (``routing``) and
per-class figures read from Redis (``status``)."""

from sluice.queues.catalog import DEFAULT_CLASSES, Catalog, ResourceClass

__all__ = ["Catalog", "ResourceClass", "DEFAULT_CLASSES"]
