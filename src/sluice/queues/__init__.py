"""Resource classes (the queues): the catalog (``catalog``), the Celery router (``routing``),
per-class figures read from Redis (``status``), and the cluster's task catalog
(``task_catalog``: what each task the workers registered needs)."""

from sluice.queues.catalog import DEFAULT_CLASSES, Catalog, ResourceClass

__all__ = ["Catalog", "ResourceClass", "DEFAULT_CLASSES"]
