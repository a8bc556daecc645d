"""Task metrics from Celery's events under celery-exporter's names, with a real worker sending
events (-E): each counter and histogram checked against what the tasks did, in the registry
``sluice metrics`` serves; every metric the alert rules read is in that scrape."""

from __future__ import annotations

import importlib
import re

from prometheus_client.core import CollectorRegistry

from sluice.deploy import alerts, metrics
from sluice.deploy.task_events import OTHER
from tests.conftest import Workers, wait_for


def _total(registry: CollectorRegistry, sample: str, **labels: str) -> float:
    """The sum of ``sample``'s values over every series whose labels include ``labels``."""
    return sum(s.value for metric in registry.collect() for s in metric.samples
               if s.name == sample and labels.items() <= s.labels.items())


def test_succeeded_failed_and_retried_tasks_are_counted_by_name_queue_and_worker(workers: Workers) -> None:
    """Three ok, one boom (ValueError) and one flaky (a retry, then success) on one worker:
    sent, started, succeeded, failed (with its exception) and retried counts per task on the
    worker's hostname and the cpu queue and class, the runtime and wait histograms' counts, the
    worker's gauges; with a cap of two task names, the third seen (flaky) is counted as "other".
    Every metric an alert rule reads is in the scrape."""
    observed = importlib.import_module("tests.apps.observed")
    app = observed.app
    registry = metrics.registry(app.redis, app.catalog, events_app=app, task_names=2, settings=app.settings)
    workers.start("tests.apps.observed", "cpu", "observed", "-E", "--without-mingle", "--without-gossip")
    host = "observed@test"
    wait_for(lambda: _total(registry, "celery_worker_up", hostname=host) == 1, 30,
             "the receiver to see the worker's heartbeat")
    results = [observed.ok.delay(n) for n in range(3)]
    failing, retrying = observed.boom.delay(), observed.flaky.delay()
    assert [r.get(timeout=30) for r in results] == [0, 1, 2] and retrying.get(timeout=30) == "done"
    failing.get(timeout=30, propagate=False)
    on_cpu = {"queue_name": "cpu", "resource_class": "cpu"}
    ok, boom = observed.ok.name, observed.boom.name
    expected = {("celery_task_succeeded_total", OTHER): 1, ("celery_task_started_total", ok): 3,
                ("celery_task_succeeded_total", ok): 3, ("celery_task_failed_total", boom): 1,
                ("celery_task_started_total", OTHER): 2, ("celery_task_sent_total", ok): 3}
    wait_for(lambda: all(_total(registry, metric, name=name) >= count for (metric, name), count in expected.items()),
             30, "every task's events (they arrive on their own, in any order)")
    assert _total(registry, "celery_task_sent_total", name=ok, **on_cpu) == 3
    assert _total(registry, "celery_task_started_total", name=ok, hostname=host, **on_cpu) == 3
    assert _total(registry, "celery_task_succeeded_total", name=ok, hostname=host, **on_cpu) == 3
    assert _total(registry, "celery_task_failed_total", name=boom, hostname=host, exception="ValueError", **on_cpu) == 1
    assert _total(registry, "celery_task_succeeded_total", name=boom) == 0
    assert _total(registry, "celery_task_retried_total", name=OTHER, hostname=host, **on_cpu) == 1
    assert _total(registry, "celery_task_started_total", name=OTHER, hostname=host) == 2   # the retried attempt and the next
    assert _total(registry, "celery_task_runtime_count", name=ok, hostname=host, **on_cpu) == 3
    assert _total(registry, "sluice_task_wait_seconds_count", name=ok, resource_class="cpu") == 3
    assert _total(registry, "celery_worker_tasks_active", hostname=host) == 0
    scraped = {sample.name for metric in registry.collect() for sample in metric.samples}
    read = {name for _, expr, *_ in alerts.RULES for name in re.findall(r"\b(?:sluice|celery)_[a-z_]+", expr)}
    assert read and read <= scraped, read - scraped
