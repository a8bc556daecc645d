"""The Celery router: sends each task to the queue of the smallest class that fits its compute."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from sluice.compute import Compute
from sluice.errors import NoQueueFits
from sluice.headers import CHARGE, COMPUTE, SENT, TENANT, Headers, decode_charge, encode_charge
from sluice.tenants import DEFAULT_TENANT, check_tenant, current_tenant, split_queue, tenant_queue

if TYPE_CHECKING:
    from sluice.app import App

log = logging.getLogger("sluice.routing")


class ComputeRouter:
    """A ``task_routes`` entry. Routes by effective compute, cached per task name.

    A task this process has not imported is routed by the cluster's task catalog (what the
    workers registered); a name no worker registered goes to the default class, with one warning.
    An explicit ``apply_async(queue=...)`` wins among the classes that can hold the task; one
    that cannot is :class:`NoQueueFits` here, at publish (workers would forward it anyway).

    Every message is stamped with what its task holds while it runs (the ``sluice_charge``
    header), and a call of a tenant other than the default one (``sluice.tenants``: the call's
    ``tenant=``, its ``sluice_tenant`` header, ``with sluice.tenant(...)``, the App's default)
    goes to that tenant's queue of the class, with the tenant in its headers; a task larger
    than its tenant's quota there is :class:`OverQuota`, at publish.
    """

    def __init__(self, app: App) -> None:
        self.app = app
        self._by_task: dict[str, tuple[str, str]] = {}  #: name -> (queue, charge) of a task routed by its code
        self._unknown: set[str] = set()

    def __call__(
        self, name: str, args: Any, kwargs: Any, options: dict[str, Any], task: Any = None, **_: Any
    ) -> dict[str, Any]:
        explicit = getattr(options.get("queue"), "name", options.get("queue"))  # Celery may expand it to a Queue
        if isinstance(explicit, str):
            explicit = split_queue(explicit)[0]  # a tenant's queue: its class
        tenant = self._tenant(options)
        route = self._route(name, options, explicit)
        if options.get("priority"):  # a lower priority than the first: its wait is bounded (aging)
            _stamp(route, options, {SENT: round(time.time(), 3)})
        if tenant != DEFAULT_TENANT and route["queue"] in self.app.catalog:
            self._check_quota(name, route, options, tenant)
            _stamp(route, options, {TENANT: tenant})
            route["queue"] = tenant_queue(route["queue"], tenant)
            route["declare"] = ()  # as for the class's own queue, below
            if options.get("queue") is not None:  # Celery merges the options over the route
                options["queue"] = route["queue"]
            return route
        if tenant != DEFAULT_TENANT:  # a queue that is no class (a worker's own): the tenant travels on
            _stamp(route, options, {TENANT: tenant})
        if explicit in (None, route["queue"]) and not options.get("exchange"):
            # Celery publishes a class queue's message by the queue's name (the anonymous exchange),
            # and on Redis that is an LPUSH to its list: kombu's declare before each publish (a
            # binding for an exchange never used, a ninth of a .delay()) adds nothing. A queue
            # outside the classes, or a caller's own exchange, keeps it.
            route["declare"] = ()
        return route

    def _tenant(self, options: dict[str, Any]) -> str:
        """The call's tenant (see the class docstring), checked; ``tenant=`` leaves the options
        here (Celery would publish an unknown option as a message property)."""
        named = options.pop("tenant", None)
        headers = options.get("headers")
        if named is None and isinstance(headers, dict):
            named = headers.get(TENANT)
        if named is None:  # checked where it was set: no check on every .delay()
            return current_tenant() or self.app.default_tenant
        return check_tenant(named)

    def _route(self, name: str, options: dict[str, Any], explicit: Any) -> dict[str, Any]:
        headers = options.get("headers")
        compute = Headers.read(headers).compute if headers else None
        if compute is not None:
            compute = self.app.resolve(name, compute.inherit(self.app.default_compute))
        if isinstance(explicit, str) and explicit in self.app.catalog:
            known = compute or self._known_compute(name)
            self._check_holds(name, known, explicit)
            return _charged({"queue": explicit}, options, known)
        if compute is not None:
            return _charged({"queue": self.app.catalog.route(compute, name).name}, options, compute)
        cached = self._by_task.get(name)
        if cached is not None:
            return _charged({"queue": cached[0]}, options, cached[1])
        inherited, fallback = self._declared(name)
        if inherited is None:
            return {"queue": self._route_unknown(name)}
        if inherited.auto_memory:  # learned: routed by the size of now, which travels with the message
            return self._learned(name, self.app.resolve(name, inherited, fallback), options)
        queue = self.app.catalog.route(inherited, name).name
        if name in self.app.tasks:
            self._by_task[name] = (queue, encode_charge(inherited))
        return _charged({"queue": queue}, options, inherited)

    def _learned(self, name: str, compute: Compute, options: dict[str, Any]) -> dict[str, Any]:
        """Route a ``memory="auto"`` task by its learned size, and put that size in its headers so
        the worker holds the attempt to it (and escalates from it)."""
        route: dict[str, Any] = {"queue": self.app.catalog.route(compute, name).name}
        _stamp(route, options, {COMPUTE: compute.to_dict(), CHARGE: encode_charge(compute)})
        return route

    def _check_quota(self, name: str, route: dict[str, Any], options: dict[str, Any], tenant: str) -> None:
        """A task larger than its tenant's quota on its class could never start: refused here."""
        headers = options["headers"] if isinstance(options.get("headers"), dict) else route.get("headers", {})
        if CHARGE not in headers:
            return
        queue = route["queue"]
        refusal = self.app.catalog.get(queue).share(tenant).refusal(name, decode_charge(headers[CHARGE]), queue, tenant)
        if refusal is not None:
            raise refusal

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


def _stamp(route: dict[str, Any], options: dict[str, Any], stamp: dict[str, Any]) -> None:
    """Add ``stamp`` to the message's headers. Celery merges ``options`` over the returned
    route, so headers the caller gave are extended in place."""
    if isinstance(options.get("headers"), dict):
        options["headers"].update(stamp)
    else:
        route["headers"] = {**route.get("headers", {}), **stamp}


def _charged(route: dict[str, Any], options: dict[str, Any], compute: Compute | str | None) -> dict[str, Any]:
    """``route`` with the message's charge stamped (a compute, or its charge already encoded)."""
    if compute is not None:
        _stamp(route, options, {CHARGE: compute if isinstance(compute, str) else encode_charge(compute)})
    return route
