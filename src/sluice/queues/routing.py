"""The Celery router: sends each task to the queue of the smallest class that fits its compute."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sluice.compute import Compute
from sluice.errors import NoQueueFits
from sluice.headers import COMPUTE, Headers

if TYPE_CHECKING:
    from sluice.app import App

log = logging.getLogger("sluice.routing")


class ComputeRouter:
    """A ``task_routes`` entry. Routes by effective compute, cached per task name.

    A task this process has not imported is routed by the cluster's task catalog (what the
    workers registered); a name no worker registered goes to the default class, with one warning.
    An explicit ``apply_async(queue=...)`` wins among the classes that can hold the task; one
    that cannot is :class:`NoQueueFits` here, at publish (workers would forward it anyway).
    """

    def __init__(self, app: App) -> None:
        self.app = app
        self._by_task: dict[str, str] = {}
        self._unknown: set[str] = set()

    def __call__(
        self, name: str, args: Any, kwargs: Any, options: dict[str, Any], task: Any = None, **_: Any
    ) -> dict[str, Any]:
        explicit = getattr(options.get("queue"), "name", options.get("queue"))  # Celery may expand it to a Queue
        route = self._route(name, options, explicit)
        if explicit in (None, route["queue"]) and not options.get("exchange"):
            # Celery publishes a class queue's message by the queue's name (the anonymous exchange),
            # and on Redis that is an LPUSH to its list: kombu's declare before each publish (a
            # binding for an exchange never used, a ninth of a .delay()) adds nothing. A queue
            # outside the classes, or a caller's own exchange, keeps it.
            route["declare"] = ()
        return route

    def _route(self, name: str, options: dict[str, Any], explicit: Any) -> dict[str, Any]:
        headers = options.get("headers")
        compute = Headers.read(headers).compute if headers else None
        if compute is not None:
            compute = self.app.resolve(name, compute.inherit(self.app.default_compute))
        if isinstance(explicit, str) and explicit in self.app.catalog:
            self._check_holds(name, compute or self._known_compute(name), explicit)
            return {"queue": explicit}
        if compute is not None:
            return {"queue": self.app.catalog.route(compute, name).name}
        queue = self._by_task.get(name)
        if queue is not None:
            return {"queue": queue}
        inherited, fallback = self._declared(name)
        if inherited is None:
            return {"queue": self._route_unknown(name)}
        if inherited.auto_memory:  # learned: routed by the size of now, which travels with the message
            return self._learned(name, self.app.resolve(name, inherited, fallback), options)
        queue = self.app.catalog.route(inherited, name).name
        if name in self.app.tasks:
            self._by_task[name] = queue
        return {"queue": queue}

    def _learned(self, name: str, compute: Compute, options: dict[str, Any]) -> dict[str, Any]:
        """Route a ``memory="auto"`` task by its learned size, and put that size in its headers so
        the worker holds the attempt to it (and escalates from it). Celery merges ``options``
        over the returned route, so headers the caller gave are extended in place."""
        route: dict[str, Any] = {"queue": self.app.catalog.route(compute, name).name}
        stamp = {COMPUTE: compute.to_dict()}
        if isinstance(options.get("headers"), dict):
            options["headers"].update(stamp)
        else:
            route["headers"] = stamp
        return route

    def _declared(self, name: str) -> tuple[Compute | None, int | None]:
        """A task's compute over its app's default ("auto" memory unresolved) and what "auto"
        falls back to: from this app's code, else the task catalog; (None, None) if neither has it."""
        if name in self.app.tasks:
            return self.app.inherited_compute(name), None
        entry = self.app.task_directory.get(name)
        return (entry.effective, entry.fallback) if entry is not None else (None, None)

    def _known_compute(self, name: str) -> Compute | None:
        inherited, fallback = self._declared(name)
        return None if inherited is None else self.app.resolve(name, inherited, fallback)

    def _route_unknown(self, name: str) -> str:
        default = self.app.catalog.default_class.name
        if name not in self._unknown:
            self._unknown.add(name)
            log.warning(
                "task %s is not registered here nor by any worker in the task catalog; sending it to "
                "the default class %s (a worker that has it forwards it to the class it needs)",
                name,
                default,
            )
        return default

    def _check_holds(self, name: str, compute: Compute | None, queue: str) -> None:
        slot = self.app.catalog.get(queue).slot
        if compute is None or compute.fits_in(slot):
            return
        holding = [rc.name for rc in self.app.catalog if compute.fits_in(rc.slot)]
        raise NoQueueFits(
            f"task {name} needs {compute.describe()} but queue {queue!r} holds {slot.describe()}; "
            f"send it without queue= or to a class that holds it: {', '.join(holding) or 'none'}"
        )
