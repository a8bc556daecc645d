"""Prometheus alert rules for what only sluice knows, on the metrics ``sluice metrics`` exports:
a class with work waiting and no worker, dead letters growing, memory kills, a task outgrowing
half its class's slot, a worker whose heartbeats stopped without a goodbye.

The same groups go out as a plain rules file (``prometheus --config`` ``rule_files``) and as a
Prometheus Operator ``PrometheusRule`` (its ``spec`` is the rules file), both from ``sluice
deploy render``; ``promtool check rules`` and ``promtool test rules`` check them (tests)."""

from __future__ import annotations

from typing import Any

#: The rules, one group: each an alert name, its PromQL, how long it must hold, its severity and
#: what it means.
RULES: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "SluiceClassWaitingWithoutWorkers",
        "sum by (resource_class) (sluice_queued) > 0"
        " and on (resource_class) sum by (resource_class) (sluice_workers_online) == 0",
        "10m",
        "critical",
        "{{ $labels.resource_class }} has had work waiting and no worker for 10 minutes: its "
        "Deployment is at zero, failing to start, or cannot be scheduled",
    ),
    (
        "SluiceDeadLettersGrowing",
        "sum by (resource_class) (increase(sluice_dead_letters_total[15m])) > 0",
        "0m",
        "warning",
        "{{ $labels.resource_class }} kept {{ $value | humanize }} message(s) as dead letters in 15 minutes "
        "(sluice dead-letters list shows why)",
    ),
    (
        "SluiceMemoryKillsHigh",
        "sum by (resource_class) (increase(sluice_memory_kills_total[15m])) > 5",
        "0m",
        "warning",
        "{{ $labels.resource_class }}: {{ $value | humanize }} tasks killed for memory in 15 minutes "
        "(sluice explain flags the under-provisioned tasks)",
    ),
    (
        "SluiceTaskOverHalfItsSlot",
        'max by (task) (sluice_task_memory_bytes{quantile="p95"})'
        " > 0.5 * max by (task) (sluice_task_slot_memory_bytes)",
        "30m",
        "info",
        "{{ $labels.task }} uses over half a slot of its class at p95: one bigger input from a memory "
        'kill (declare more memory, or memory="auto")',
    ),
    (
        "SluiceWorkerHeartbeatMissing",
        "celery_worker_up == 0",
        "2m",
        "warning",
        "{{ $labels.hostname }} stopped sending heartbeats without going offline: its tasks are "
        "given back once its heartbeat key expires (orphan reaper)",
    ),
)


def rule_groups() -> list[dict[str, Any]]:
    """The rule groups, as a rules file and a PrometheusRule's spec have them."""
    rules = [
        {
            "alert": alert,
            "expr": expr,
            "for": hold,
            "labels": {"severity": severity},
            "annotations": {"summary": summary},
        }
        for alert, expr, hold, severity, summary in RULES
    ]
    return [{"name": "sluice", "rules": rules}]


def rules_file() -> dict[str, Any]:
    """A Prometheus rules file (``rule_files:`` in prometheus.yml)."""
    return {"groups": rule_groups()}


def prometheus_rule(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """The Prometheus Operator's ``PrometheusRule`` with the same groups."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "sluice", "namespace": namespace, "labels": labels},
        "spec": {"groups": rule_groups()},
    }
