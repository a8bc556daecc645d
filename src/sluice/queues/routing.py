"""The Celery router: sends each task to the queue of the smallest class that fits its compute."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sluice.headers import Headers

if TYPE_CHECKING:
    from sluice.app import App


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
        compute = Headers.read(headers).compute if headers else None
        if compute is not None:
            return {"queue": self.app.catalog.route(compute.inherit(self.app.default_compute), name).name}
        queue = self._by_task.get(name)
        if queue is None:
            queue = self._by_task[name] = self.app.route(name).name
        return {"queue": queue}
