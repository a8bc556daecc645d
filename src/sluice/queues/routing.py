"""The Celery router: sends each task to the queue of the smallest class that fits its compute."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sluice.compute import Compute

if TYPE_CHECKING:
    from sluice.app import App

#: Message header carrying a per-message compute (set when a retry escalates it).
COMPUTE_HEADER = "sluice_compute"


class ComputeRouter:
    """A ``task_routes`` entry. Routes by effective compute, cached per task name.

    Celery merges the caller's options into the returned route (in place, so each call returns
    a new dict), and an explicit ``apply_async(queue=...)`` still wins.
    """

    def __init__(self, app: App) -> None:
        self.app = app
        self._by_task: dict[str, str] = {}

    def __call__(self, name: str, args: Any, kwargs: Any, options: dict[str, Any], task: Any = None,
                 **_: Any) -> dict[str, str]:
        headers = options.get("headers")
        if headers and COMPUTE_HEADER in headers:
            compute = Compute.from_dict(headers[COMPUTE_HEADER]).inherit(self.app.default_compute)
            return {"queue": self.app.catalog.route(compute, name).name}
        queue = self._by_task.get(name)
        if queue is None:
            queue = self._by_task[name] = self.app.route(name).name
        return {"queue": queue}
