"""``sluice deploy render``: Kubernetes objects for a catalog of resource classes.

Per class: a worker Deployment whose pods are Guaranteed QoS (requests == limits == slot size x
slots, ``nvidia.com/gpu`` for gpu classes) and pass the "restricted" Pod Security Standard, and
a KEDA ScaledObject on the class's Redis list. Around them (see ``platform.py``): the
Namespace, Redis (one node, or three with Sentinel), Flower and the built-in autoscaler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from sluice.deploy import alerts, platform
from sluice.deploy.platform import labels
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.catalog import Catalog, ResourceClass
from sluice.tenants import tenant_queue
from sluice.units import format_cpu, format_memory

Manifest = dict[str, Any]


@dataclass(frozen=True)
class RenderOptions:
    """What the rendered objects need beyond the catalog."""

    app: str = "sluice.demo"
    namespace: str = "sluice"
    image: str = "ghcr.io/sluice-dev/sluice:0.1.0"
    #: The longest a task may run (its hard time limit); pods get a minute more to shut down warm.
    grace_seconds: int = 3600
    redis_storage: str = "8Gi"
    gpu_tolerations: tuple[dict[str, str], ...] = (
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    )
    gpu_node_selector: dict[str, str] = field(default_factory=dict)
    #: Three Redis nodes with Sentinel instead of one (``--sentinel``); every client finds the master
    #: through the Sentinels.
    redis_sentinel: bool = False

    @property
    def broker_env(self) -> list[dict[str, Any]]:
        """REDIS_PASSWORD from the Secret, then the broker URL built from it (Kubernetes expands it):
        the Redis Service, or every Sentinel, the master set's name and the Sentinels' password."""
        password = platform.REDIS_PASSWORD_REF
        if self.redis_sentinel:
            url = ";".join(
                f"sentinel://:$(REDIS_PASSWORD)@{node}:{platform.SENTINEL_PORT}/0"
                for node in platform.sentinel_nodes(self)
            )
            broker = [
                {"name": "SLUICE_BROKER_URL", "value": url},
                {"name": "SLUICE_SENTINEL_MASTER", "value": platform.SENTINEL_MASTER},
                {"name": "SLUICE_SENTINEL_PASSWORD", **password},
            ]
        else:
            broker = [
                {
                    "name": "SLUICE_BROKER_URL",
                    "value": f"redis://:$(REDIS_PASSWORD)@{platform.REDIS_NAME}."
                    f"{self.namespace}.svc:{platform.REDIS_PORT}/0",
                }
            ]
        return [
            {"name": "REDIS_PASSWORD", **password},
            *broker,
            {"name": "SLUICE_HOME", "value": "/tmp/sluice"},
            {"name": "HOME", "value": "/tmp"},
        ]


#: Workers sign and check remote calls with this Secret's key; without the Secret (optional) a
#: worker runs no remote calls.
REMOTE_SECRET_ENV = {
    "name": "SLUICE_REMOTE_SECRET",
    "valueFrom": {"secretKeyRef": {"name": platform.REMOTE_SECRET, "key": "secret", "optional": True}},
}


def worker_name(rc: ResourceClass) -> str:
    return f"sluice-worker-{rc.name}"


def worker_command(rc: ResourceClass, options: RenderOptions) -> list[str]:
    """A class's worker command, the same in a pod and in docker-compose: its node name is the
    class at the host (the pod's name), its hard time limit the grace a pod is given to stop."""
    return [
        "sluice",
        "worker",
        "-A",
        options.app,
        "--queue",
        rc.name,
        "-n",
        f"{rc.name}@%h",
        "-E",
        "--time-limit",
        str(options.grace_seconds),
    ]


def pod_resources(rc: ResourceClass) -> dict[str, str]:
    """One pod is one worker's size (``slots`` slots, or a packed class's slot): requests ==
    limits (Guaranteed QoS)."""
    size = rc.worker_size
    amounts = {"cpu": format_cpu(size.millicores or 0), "memory": format_memory(size.memory_bytes or 0)}
    if rc.is_gpu:
        amounts["nvidia.com/gpu"] = str(size.gpus)
    return amounts


def worker_deployment(rc: ResourceClass, options: RenderOptions) -> Manifest:
    amounts = pod_resources(rc)
    probe = {
        "exec": {"command": ["sluice", "check", "--worker", f"{rc.name}@%h"]},
        "periodSeconds": 15,
        "timeoutSeconds": 10,
        "failureThreshold": 4,
    }
    pod: Manifest = {
        "serviceAccountName": "default",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": options.grace_seconds + 60,
        "securityContext": platform.POD_SECURITY,
        **platform.NO_SERVICE_LINKS,
        "containers": [
            {
                "name": "worker",
                "image": options.image,
                # %h is the pod's hostname (its name): the autoscaler maps worker -> pod with it
                "args": [*worker_command(rc, options), "--loglevel", "INFO"],
                "env": [*options.broker_env, REMOTE_SECRET_ENV],
                "resources": {"requests": dict(amounts), "limits": dict(amounts)},
                "readinessProbe": probe | {"initialDelaySeconds": 5},
                "livenessProbe": probe | {"initialDelaySeconds": 30},
                "securityContext": platform.CONTAINER_SECURITY,
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            }
        ],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if rc.is_gpu:
        pod["tolerations"] = [dict(t) for t in options.gpu_tolerations]
        if options.gpu_node_selector:
            pod["nodeSelector"] = dict(options.gpu_node_selector)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": worker_name(rc), "namespace": options.namespace, "labels": labels("worker", rc.name)},
        "spec": {
            "replicas": rc.min_replicas,
            "selector": {"matchLabels": labels("worker", rc.name)},
            "template": {"metadata": {"labels": labels("worker", rc.name)}, "spec": pod},
        },
    }


def _trigger(name: str, listed: str, rc: ResourceClass, options: RenderOptions) -> Manifest:
    """KEDA's trigger on one Redis list of the class, straight or through the Sentinels."""
    where: dict[str, str] = {"address": f"{platform.REDIS_NAME}.{options.namespace}.svc:{platform.REDIS_PORT}"}
    if options.redis_sentinel:
        where = {
            "addresses": ",".join(f"{node}:{platform.SENTINEL_PORT}" for node in platform.sentinel_nodes(options)),
            "sentinelMaster": platform.SENTINEL_MASTER,
        }
    return {
        "type": "redis-sentinel" if options.redis_sentinel else "redis",
        "name": name,
        "metadata": {**where, "listName": listed, "listLength": str(rc.slots), "databaseIndex": "0"},
        "authenticationRef": {"name": platform.REDIS_AUTH},
    }


def scaled_object(rc: ResourceClass, options: RenderOptions) -> Manifest:
    """KEDA scales the class's Deployment on its whole backlog: one replica per ``slots`` waiting
    messages. KEDA's Redis trigger reads one list, and a class's messages wait on several: one
    per priority step, for the default tenant and each tenant its table names
    (``sluice.tenants``), and those parked on a rate limit are counted in one more list. So
    there is a trigger per list, and a formula (KEDA's scaling modifiers) sums them. A tenant
    the class does not name is not seen here (the built-in autoscaler sees every tenant)."""
    layout = RedisLayout()
    queues = [rc.name, *(tenant_queue(rc.name, tenant) for tenant, _ in rc.tenants)]
    lists = [*(listed for queue in queues for listed in layout.queue_lists(queue)), layout.parked_count(rc.name)]
    names = [f"list{i}" for i in range(len(lists))]
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": worker_name(rc), "namespace": options.namespace, "labels": labels("worker", rc.name)},
        "spec": {
            "scaleTargetRef": {"name": worker_name(rc)},
            "minReplicaCount": rc.min_replicas,
            "maxReplicaCount": rc.max_replicas,
            "cooldownPeriod": 300,
            "advanced": {
                "scalingModifiers": {
                    "formula": " + ".join(names),
                    "target": str(rc.slots),
                    "metricType": "AverageValue",
                }
            },
            "triggers": [_trigger(name, listed, rc, options) for name, listed in zip(names, lists)],
        },
    }


def render(catalog: Catalog, options: RenderOptions) -> dict[str, list[Manifest]]:
    """Objects grouped by file: the core topology, KEDA scaling, the built-in autoscaler, and
    monitoring (the alert rules as a Prometheus Operator ``PrometheusRule``)."""
    core = [
        platform.namespace(options),
        *platform.redis(options),
        *platform.flower(options),
        *(worker_deployment(rc, options) for rc in catalog),
    ]
    keda = [platform.trigger_authentication(options), *(scaled_object(rc, options) for rc in catalog)]
    monitoring = [alerts.prometheus_rule(options.namespace, labels("alerts"))]
    return {
        "sluice.yaml": core,
        "keda.yaml": keda,
        "autoscaler.yaml": platform.autoscaler(options),
        "monitoring.yaml": monitoring,
    }


class _PlainDumper(yaml.SafeDumper):
    """Kubernetes YAML without anchors (objects share sub-dicts in memory, not in the files), and
    a multi-line string (a script in a ConfigMap) as a block a reader can read."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def represent_str(self, data: str) -> yaml.ScalarNode:
        return self.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_PlainDumper.add_representer(str, _PlainDumper.represent_str)


def to_yaml(docs: list[Manifest], sort_keys: bool = False) -> str:
    return yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=sort_keys, width=120)
