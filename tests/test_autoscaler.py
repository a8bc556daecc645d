"""The built-in autoscaler with real Redis and real workers; the kubernetes client talks to the
HTTP fake of the Deployment, scale and pod endpoints (no API server runs here)."""

from __future__ import annotations

import importlib
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client as k8s

from sluice import Compute, ResourceClass
from sluice.deploy.autoscaler import DELETION_COST, Autoscaler, replicas_needed
from sluice.deploy.embedded import EmbeddedRedis, free_port
from sluice.deploy.metrics import serve
from sluice.deploy.platform import labels
from sluice.queues.status import ClassStatus, class_status
from tests.conftest import Workers, wait_for
from tests.kube_fake import FakeKube

pytestmark = pytest.mark.integration
DEPLOYMENT = "/apis/apps/v1/namespaces/t/deployments/sluice-worker-batch"
FAST = {"SLUICE_HEARTBEAT_INTERVAL": "0.5"}  # a key lives 2.5 s: a loaded CI box misses no beat


def _status(app, client):  # noqa: ANN001, ANN202
    return class_status(client, app.catalog)[0]


def test_scales_up_to_the_bound_then_drains_idle_workers_and_reaches_zero_after_the_busy_one(
        redis_server: EmbeddedRedis, tmp_path: Path) -> None:
    scaling = importlib.import_module("tests.apps.scaling")
    client = redis_server.client()
    client.flushdb()
    with FakeKube() as fake:
        fake.add_deployment("t", "sluice-worker-batch", 0)
        api = k8s.ApiClient(k8s.Configuration(host=fake.url))
        scaler = Autoscaler(client, scaling.app.catalog, k8s.AppsV1Api(api), k8s.CoreV1Api(api), "t",
                            scaling.app.control, cooldown=0)

        quick = [scaling.work.delay(0.01) for _ in range(49)]
        long = scaling.work.delay(6.0)
        assert scaler.tick() == {"batch": 3}                      # 50 queued, 1 slot each, max 3

        pool = Workers(client, tmp_path)
        try:
            for pod in ("pod-a", "pod-b", "pod-c"):
                fake.add_pod("t", pod, labels("worker", "batch"))
            for pod in ("pod-a", "pod-b"):                          # pod-c is still starting: no worker yet
                pool.start("tests.apps.scaling", "batch", pod, "--without-mingle", "--without-gossip", env=FAST,
                           wait=False, hostname=f"batch@{pod}")
            for result in quick:
                result.get(timeout=60)
            # nothing queued or held but the long task (a quick task's delivery can outlive its result
            # by a beat), the worker running it busy and the other idle, by their heartbeats: waited
            # for by name, as a heartbeat lags by a beat (the last quick task's worker may still say
            # busy while the long task's says idle, the picture the wrong worker would be drained by)
            wait_for(lambda: long.state == "STARTED", 30, "the long task to start")
            busy_host = long.info["hostname"]
            status = wait_for(lambda: (s := _status(scaling.app, client)).queued == 0 and s.reserved <= 1
                              and list(s.busy) == [busy_host] and len(s.idle) == 1 and s, 30,
                              "only the long task to be running, on the worker that took it")
            busy_pod, idle_pod = busy_host.split("@")[1], status.idle[0].split("@")[1]

            assert scaler.tick() == {"batch": 1}                  # never below the busy worker
            costs = {p: fake.objects[f"/api/v1/namespaces/t/pods/{p}"]["metadata"]["annotations"][DELETION_COST]
                     for p in ("pod-a", "pod-b", "pod-c")}
            assert costs == {busy_pod: "1000", idle_pod: "-1000", "pod-c": "-1000"}
            queues = scaling.app.control.inspect(destination=[status.idle[0]], timeout=2).active_queues()
            assert queues == {status.idle[0]: []}                 # drained: it takes no new work
            assert scaler.tick() == {"batch": 1}                  # still busy: hold
            # what the Deployment was told while a worker was busy: never zero
            assert [replicas for _, path, replicas in fake.scales if path == DEPLOYMENT] == [3, 1]

            long.get(timeout=60)
            wait_for(lambda: not _status(scaling.app, client).busy, 30, "the busy worker to report idle")
            assert scaler.tick() == {"batch": 0}
        finally:
            pool.stop_all()
        assert [replicas for _, path, replicas in fake.scales if path == DEPLOYMENT] == [3, 1, 0]


def test_metrics_per_class(redis_server: EmbeddedRedis) -> None:
    scaling = importlib.import_module("tests.apps.scaling")
    client = redis_server.client()
    client.flushdb()
    for _ in range(3):
        scaling.work.delay(0)
    client.set("sluice:stats:memory_kills:batch", 2)
    port = free_port()
    serve(client, scaling.app.catalog, port, "127.0.0.1")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'sluice_queued{resource_class="batch"} 3.0' in text
    assert 'sluice_workers_online{resource_class="batch"} 0.0' in text
    assert 'sluice_memory_kills_total{resource_class="batch"} 2.0' in text
    assert 'sluice_escalations_total{resource_class="batch"} 0.0' in text


def test_a_packed_class_scales_by_the_memory_and_cpu_its_messages_need() -> None:
    """Replicas for a packed 8Gi/4-cpu class: 30 waiting 1Gi tasks need 4 workers by memory, not the
    2 that 30 messages over 16 slots would give; cpu can be what binds instead."""
    packed = ResourceClass("packed", Compute(cpu="4", memory="8Gi"), slots=16, max_replicas=10, pack=True)
    status = ClassStatus(packed, queued=30, reserved=0, running=0, slots=0, busy=(), idle=())
    assert replicas_needed(status, packed) == 2                                    # by slots alone
    assert replicas_needed(status, packed, (30 * 1000, 30 << 30)) == 8             # cpu binds: 30 cores / 4
    assert replicas_needed(status, packed, (30 * 250, 30 << 30)) == 4              # memory binds: 30Gi / 8Gi
    assert replicas_needed(status, packed, (10 ** 6, 10 ** 15)) == 10              # clamped to max_replicas
