"""Resource classes (the queues) and routing a compute to the smallest class that fits."""

from sluice.queues.catalog import Catalog, ResourceClass, DEFAULT_CLASSES
from sluice.queues.routing import ComputeRouter

__all__ = ["Catalog", "ResourceClass", "DEFAULT_CLASSES", "ComputeRouter"]
