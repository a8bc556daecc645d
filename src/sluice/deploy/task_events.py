"""Task metrics from Celery's events, under the names celery-exporter gives them, so the Celery
dashboards people already run (Grafana's "Celery / Tasks" 14015 and "Celery / Tasks / By Task"
17508) read sluice unchanged, plus what only sluice knows.

``sluice metrics`` runs a receiver of Celery's task and worker events on a thread, as
celery-exporter does (so it counts what happens while it runs; Prometheus takes a restart as a
counter reset), and exports:

* ``celery_task_{sent,received,started,succeeded,failed,rejected,revoked,retried}_total`` by
  ``name``, ``hostname``, ``queue_name`` and ``resource_class`` (failed: and ``exception``);
* ``celery_task_runtime`` (histogram, seconds) by the same labels;
* ``sluice_task_wait_seconds`` (histogram): publish to start, by ``name`` and ``resource_class``;
* ``celery_worker_up`` and ``celery_worker_tasks_active`` by ``hostname``, from heartbeats.

Workers send task events when started with ``-E`` (the rendered Deployments and ``sluice up``
start them so). Task names past the ``metrics_task_names`` setting are counted as ``other``: a
bound on the series an app with generated task names would make.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.registry import Collector

from sluice.queues.catalog import Catalog
from sluice.tenants import split_queue

log = logging.getLogger("sluice.metrics")

#: Celery's task event -> the counter celery-exporter counts it in (``celery_task_<kind>_total``).
COUNTED = {
    f"task-{kind}": kind
    for kind in ("sent", "received", "started", "succeeded", "failed", "rejected", "revoked", "retried")
}
#: Where names past the cap are counted.
OTHER = "other"
#: How many tasks the receiver keeps while they run (Celery's events ``State``), for their labels.
TASKS_KEPT = 10_000
#: Wait buckets, seconds: from a busy class's milliseconds to a backlog's hour.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class TaskEventMetrics(Collector):
    """Counts Celery's task events into ``registry`` (see the module docstring); as a collector
    it yields the workers' gauges, read from the heartbeats received."""

    def __init__(self, app: Any, registry: CollectorRegistry, catalog: Catalog, max_names: int) -> None:
        self.app, self.catalog, self.max_names = app, catalog, max_names
        self.state = app.events.State(max_tasks_in_memory=TASKS_KEPT)
        self.names: set[str] = set()
        labels = ["name", "hostname", "queue_name", "resource_class"]
        self.counters = {
            event: Counter(
                f"celery_task_{kind}",
                f"Tasks with a {event} event",
                [*labels, "exception"] if kind == "failed" else labels,
                registry=registry,
            )
            for event, kind in COUNTED.items()
        }
        self.runtime = Histogram("celery_task_runtime", "Seconds a task ran", labels, registry=registry)
        self.wait = Histogram(
            "sluice_task_wait_seconds",
            "Seconds from a task's publish to its start",
            ["name", "resource_class"],
            registry=registry,
            buckets=WAIT_BUCKETS,
        )
        registry.register(self)

    def start(self) -> threading.Thread:
        """Receive events on a daemon thread for the process's lifetime (reconnecting as needed)."""
        thread = threading.Thread(target=self._receive, name="sluice-task-events", daemon=True)
        thread.start()
        return thread

    def _receive(self) -> None:
        while True:
            try:
                with self.app.connection_for_read() as connection:
                    receiver = self.app.events.Receiver(connection, handlers={"*": self.on_event})
                    receiver.capture(limit=None, timeout=None, wakeup=False)
            except Exception:  # the broker away: counted again once it is back
                log.warning("task events: receiver stopped; reconnecting in 1 s", exc_info=True)
                time.sleep(1)

    def on_event(self, event: dict[str, Any]) -> None:
        """One Celery event: the task counters and histograms; heartbeats go to the state."""
        self.state.event(event)
        kind = event.get("type", "")
        if kind not in self.counters:
            return
        task = self.state.tasks.get(event.get("uuid"))
        if task is None or not task.name:
            return
        queue = getattr(task, "queue", None) or task.routing_key or ""
        resource_class = self._class_of(queue)
        name = self._name(task.name)
        labels = {
            "name": name,
            "hostname": event.get("hostname") or "",
            "queue_name": queue,
            "resource_class": resource_class,
        }
        if kind == "task-failed":
            labels["exception"] = _exception_class(task.exception)
        self.counters[kind].labels(**labels).inc()
        if kind == "task-succeeded" and task.runtime is not None:
            labels.pop("exception", None)
            self.runtime.labels(**labels).observe(task.runtime)
        if kind == "task-started" and task.sent and task.started:
            self.wait.labels(name=name, resource_class=resource_class).observe(max(0.0, task.started - task.sent))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("celery_worker_up", "Whether a worker's heartbeat is recent", labels=["hostname"])
        active = GaugeMetricFamily("celery_worker_tasks_active", "Tasks a worker is running", labels=["hostname"])
        for hostname, worker in list(self.state.workers.items()):
            alive = bool(worker.alive)
            up.add_metric([hostname], 1 if alive else 0)
            active.add_metric([hostname], (worker.active or 0) if alive else 0)
        yield from (up, active)

    def _name(self, name: str) -> str:
        if name in self.names:
            return name
        if len(self.names) >= self.max_names:
            return OTHER
        self.names.add(name)
        return name

    def _class_of(self, queue: str) -> str:
        base, _ = split_queue(queue)
        return base if base in self.catalog else ""


def _exception_class(exception: str | None) -> str:
    """The class name of an event's ``exception`` text ("ValueError('x')" -> "ValueError")."""
    return (exception or "").split("(", 1)[0].strip()
