"""Task-side pieces: the ComputeTask base class."""

from sluice.tasks.base import ComputeTask

__all__ = ["ComputeTask"]
