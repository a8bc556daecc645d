"""``sluice autoscale``: the built-in controller for clusters without KEDA.

Per class, each tick: read queued + reserved work and the workers' heartbeats from Redis, compute
the replicas needed (work / slots, or for a packed class also the waiting and held messages'
cpu and memory over one worker's size; clamped to min/max, zero allowed, never below the busy
workers), and patch the Deployment's scale subresource. Scaling down never kills a busy worker:

1. every pod is annotated with ``controller.kubernetes.io/pod-deletion-cost`` (busy pods high,
   the chosen idle ones lowest), so the ReplicaSet removes the chosen pods;
2. the chosen workers are drained first: their consumers (class, intake, own queue) are
   cancelled, so they take no new work;
3. only then is the scale patched, and never below the number of busy workers.

Scale-up is immediate but limited to ``max_step_up`` replicas a tick; scale-down waits
``cooldown`` seconds after any change and removes at most ``max_step_down`` a tick.
"""

from __future__ import annotations

import logging
import math
import time

import redis
from celery.app.control import Control
from celery.utils.nodenames import worker_direct
from kubernetes import client as k8s

from sluice.deploy.manifests import worker_name
from sluice.deploy.platform import labels
from sluice.errors import ClusterUnavailable
from sluice.queues.catalog import Catalog, ResourceClass
from sluice.queues.status import ClassStatus, class_status, demand
from sluice.workers.periodic import Periodic

log = logging.getLogger("sluice.autoscaler")

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def replicas_needed(status: ClassStatus, rc: ResourceClass, demand: tuple[int, int] | None = None) -> int:
    """Work over slots, clamped to the class's bounds, never below the busy workers (pure). Work
    is what waits and its tenants' quotas let start (``ClassStatus.demand``) and what runs. For a
    packed class, also the ``demand`` (millicores, bytes of the waiting and held messages) over
    one worker's size, whichever needs more workers."""
    work = status.demand + max(status.reserved, status.running)
    need = math.ceil(work / rc.slots)
    if rc.pack and demand is not None:
        millicores, memory = demand
        need = max(
            need, math.ceil(millicores / (rc.slot.millicores or 1)), math.ceil(memory / (rc.slot.memory_bytes or 1))
        )
    return max(min(max(need, rc.min_replicas), rc.max_replicas), len(status.busy))


class Autoscaler(Periodic):
    """One controller for every class of a catalog, in one namespace."""

    def __init__(
        self,
        client: redis.Redis,
        catalog: Catalog,
        apps: k8s.AppsV1Api,
        core: k8s.CoreV1Api,
        namespace: str,
        control: Control,
        interval: float = 5.0,
        cooldown: float = 60.0,
        max_step_up: int = 10,
        max_step_down: int = 2,
    ) -> None:
        super().__init__("sluice-autoscaler", interval)
        self.client = client
        self.catalog = catalog
        self.apps = apps
        self.core = core
        self.namespace = namespace
        self.control = control
        self.cooldown = cooldown
        self.max_step_up = max_step_up
        self.max_step_down = max_step_down
        self._last_change: dict[str, float] = {}

    def tick(self) -> dict[str, int]:
        """Reconcile every class once; returns the replicas each class has afterwards."""
        rows = {row.resource_class.name: row for row in class_status(self.client, self.catalog)}
        return {rc.name: self.reconcile(rc, rows[rc.name]) for rc in self.catalog}

    def reconcile(self, rc: ResourceClass, status: ClassStatus) -> int:
        name = worker_name(rc)
        spec = self.apps.read_namespaced_deployment_scale(name, self.namespace).spec
        current = (spec.replicas or 0) if spec is not None else 0  # unset: none wanted
        target = replicas_needed(status, rc, demand(self.control.app, self.client, rc.name) if rc.pack else None)
        if target > current:
            return self._scale(rc, current, min(target, current + self.max_step_up), status, "work waiting")
        if target < current:
            if time.monotonic() - self._last_change.get(rc.name, -math.inf) < self.cooldown:
                return current
            return self._scale_down(rc, current, max(target, current - self.max_step_down), status)
        return current

    def _scale_down(self, rc: ResourceClass, current: int, target: int, status: ClassStatus) -> int:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=_selector(labels("worker", rc.name)))
        by_pod = {host.split("@", 1)[-1]: host for host in (*status.busy, *status.idle)}
        names = [_pod_name(pod, self.namespace) for pod in pods.items]
        idle_pods = [n for n in names if by_pod.get(n) in status.idle]
        unknown = [n for n in names if n not in by_pod]  # starting, no heartbeat yet
        victims = (unknown + idle_pods)[: current - target]
        target = current - len(victims)
        if not victims:
            return current
        for pod_name in names:
            host = by_pod.get(pod_name)
            cost = -1000 if pod_name in victims else (1000 if host in status.busy else 0)
            self.core.patch_namespaced_pod(
                pod_name, self.namespace, {"metadata": {"annotations": {DELETION_COST: str(cost)}}}
            )
        drained = [by_pod[p] for p in victims if p in by_pod]
        intake = self.control.app.settings.intake_queue  # a sluice App's control
        for host in drained:  # the class queue, the intake and the worker's own queue: no new work at all
            for queue in (rc.name, intake, worker_direct(host).name):
                self.control.cancel_consumer(queue, destination=[host], reply=True, timeout=2.0)
        return self._scale(rc, current, target, status, f"draining idle {', '.join(victims)}")

    def _scale(self, rc: ResourceClass, current: int, target: int, status: ClassStatus, why: str) -> int:
        self.apps.patch_namespaced_deployment_scale(worker_name(rc), self.namespace, {"spec": {"replicas": target}})
        self._last_change[rc.name] = time.monotonic()
        log.info(
            "class %s: %d -> %d replicas (%s; queued %d, reserved %d, busy workers %d)",
            rc.name,
            current,
            target,
            why,
            status.queued,
            status.reserved,
            len(status.busy),
        )
        return target


def _pod_name(pod: k8s.V1Pod, namespace: str) -> str:
    """A listed pod's name (the API's types leave every field optional; a pod always has one)."""
    if pod.metadata is None or not pod.metadata.name:
        raise ClusterUnavailable(
            f"the Kubernetes API listed a pod without a name in namespace {namespace!r}: {pod!r:.200}"
        )
    return pod.metadata.name


def _selector(selector: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in selector.items())
