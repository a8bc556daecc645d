"""The objects around the workers: Namespace, Redis (one, or three with Sentinel), Flower, KEDA
auth, the built-in autoscaler.

Secrets are referenced, never rendered: create them once (see the README's Kubernetes section).
Every pod passes the "restricted" Pod Security Standard.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.deploy.manifests import RenderOptions

Manifest = dict[str, Any]

REDIS_NAME = "sluice-redis"
REDIS_SECRET = "sluice-redis"  #: key "password"
REDIS_AUTH = "sluice-redis-auth"  #: the KEDA TriggerAuthentication
REDIS_PASSWORD_REF: Manifest = {"valueFrom": {"secretKeyRef": {"name": REDIS_SECRET, "key": "password"}}}
REMOTE_SECRET = "sluice-remote"  #: key "secret": signs what workers run or unpickle from Redis (optional)
FLOWER_SECRET = "sluice-flower"  #: key "basic-auth", "user:password"
AUTOSCALER = "sluice-autoscaler"
METRICS_PORT = 9100
REDIS_PORT, SENTINEL_PORT = 6379, 26379
#: With ``--sentinel``: how many Redis nodes (each with a Sentinel; quorum 2) and the master set's name.
SENTINEL_NODES = 3
SENTINEL_MASTER = "sluice"

POD_SECURITY: Manifest = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
#: Kubernetes otherwise puts every Service's address into each pod's environment as <SERVICE>_...
#: variables: for the sluice-redis and sluice-flower Services, SLUICE_REDIS_PORT and the like,
#: which clutter every sluice pod's environment beside its settings (sluice knows their shape and
#: leaves them alone, for the pods of users' own apps that keep service links on).
NO_SERVICE_LINKS: Manifest = {"enableServiceLinks": False}
CONTAINER_SECURITY: Manifest = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def labels(component: str, resource_class: str | None = None) -> dict[str, str]:
    """The labels every sluice object carries (selectors use them too)."""
    out = {"app.kubernetes.io/name": "sluice", "app.kubernetes.io/component": component}
    if resource_class:
        out["sluice.dev/class"] = resource_class
    return out


def _meta(name: str, options: RenderOptions, component: str) -> Manifest:
    return {"name": name, "namespace": options.namespace, "labels": labels(component)}


def _pod(options: RenderOptions, component: str, container: Manifest, **extra: Any) -> Manifest:
    container = {
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        **container,
    }
    return {
        "metadata": {"labels": labels(component)},
        "spec": {
            "securityContext": POD_SECURITY,
            **NO_SERVICE_LINKS,
            "automountServiceAccountToken": False,
            "containers": [container],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            **extra,
        },
    }


def _service(name: str, options: RenderOptions, component: str, port: int) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, options, component),
        "spec": {"selector": labels(component), "ports": [{"name": component, "port": port, "targetPort": port}]},
    }


def namespace(options: RenderOptions) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": options.namespace, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
    }


def redis_command() -> list[str]:
    """Redis with AOF in /data and no eviction (a queue must never silently lose messages to make
    room), its password from ``$REDIS_PASSWORD`` fed to it as config on stdin by a here-document:
    the shell's own, so the password is in no argv for ``ps`` to show, and ``exec`` leaves Redis
    the container's one process, the one a stop's SIGTERM reaches (a pipeline would leave a shell
    that ignores it, and Redis killed at the end of the grace period). The image's entrypoint still
    runs (it drops root to the redis user where it starts as root, in compose)."""
    return [
        "sh",
        "-c",
        "exec docker-entrypoint.sh redis-server - --appendonly yes --dir /data "
        "--maxmemory-policy noeviction <<EOF\nrequirepass $REDIS_PASSWORD\nEOF\n",
    ]


def _redis_password_env() -> list[Manifest]:
    return [{"name": "REDIS_PASSWORD", **REDIS_PASSWORD_REF}, {"name": "REDISCLI_AUTH", **REDIS_PASSWORD_REF}]


def _data_volume(options: RenderOptions) -> Manifest:
    return {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": options.redis_storage}}},
    }


def redis(options: RenderOptions) -> list[Manifest]:
    """Redis for every class: one node (see :func:`redis_command`) on a persistent volume, or with
    ``options.redis_sentinel`` three with Sentinel (:func:`redis_sentinel`)."""
    if options.redis_sentinel:
        return redis_sentinel(options)
    container = {
        "name": "redis",
        "image": "redis:7.2",
        "command": redis_command(),
        "env": _redis_password_env(),
        "ports": [{"containerPort": REDIS_PORT, "name": "redis"}],
        "readinessProbe": {"exec": {"command": ["redis-cli", "ping"]}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1Gi"}},
    }
    template = _pod(options, "redis", container)
    template["spec"]["containers"][0]["volumeMounts"].append({"name": "data", "mountPath": "/data"})
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(REDIS_NAME, options, "redis"),
        "spec": {
            "serviceName": REDIS_NAME,
            "replicas": 1,
            "selector": {"matchLabels": labels("redis")},
            "template": template,
            "volumeClaimTemplates": [_data_volume(options)],
        },
    }
    return [_service(REDIS_NAME, options, "redis", REDIS_PORT), statefulset]


def sentinel_nodes(options: RenderOptions) -> list[str]:
    """Each Redis node's stable address: its pod's name under the headless Service."""
    return [f"{REDIS_NAME}-{i}.{REDIS_NAME}.{options.namespace}.svc" for i in range(SENTINEL_NODES)]


def redis_node_script() -> str:
    return resources.files("sluice.deploy").joinpath("redis_node.sh").read_text()


def redis_sentinel(options: RenderOptions) -> list[Manifest]:
    """Three Redis nodes, each with a Sentinel beside it (``redis_node.sh``): a failover in about
    ``down-after`` (5 s) plus an election when the master's node dies, and a node that comes back
    rejoins as a replica. Pods are spread over nodes, and at most one is evicted at a time."""
    env = [
        *_redis_password_env(),
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE", "value": f"$(POD_NAME).{REDIS_NAME}.{options.namespace}.svc"},
        {"name": "NODES", "value": " ".join(sentinel_nodes(options))},
        {"name": "MASTER_SET", "value": SENTINEL_MASTER},
        {"name": "DATA", "value": "/data"},
        {"name": "SENTINEL_DIR", "value": "/sentinel"},
    ]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "scripts", "mountPath": "/scripts", "readOnly": True}]
    redis_container = {
        "name": "redis",
        "image": "redis:7.2",
        "command": ["sh", "/scripts/redis_node.sh", "redis"],
        "env": env,
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [*mounts, {"name": "data", "mountPath": "/data"}],
        "ports": [{"containerPort": REDIS_PORT, "name": "redis"}],
        "readinessProbe": {"exec": {"command": ["redis-cli", "ping"]}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1Gi"}},
    }
    sentinel_container = {
        "name": "sentinel",
        "image": "redis:7.2",
        "command": ["sh", "/scripts/redis_node.sh", "sentinel"],
        "env": env,
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [*mounts, {"name": "sentinel", "mountPath": "/sentinel"}],
        "ports": [{"containerPort": SENTINEL_PORT, "name": "sentinel"}],
        "readinessProbe": {"exec": {"command": ["redis-cli", "-p", str(SENTINEL_PORT), "ping"]}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "100m", "memory": "128Mi"}},
    }
    spread = {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": labels("redis")},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        }
    }
    template = {
        "metadata": {"labels": labels("redis")},
        "spec": {
            "securityContext": POD_SECURITY,
            **NO_SERVICE_LINKS,
            "automountServiceAccountToken": False,
            "affinity": spread,
            "containers": [redis_container, sentinel_container],
            "volumes": [
                {"name": "tmp", "emptyDir": {}},
                {"name": "sentinel", "emptyDir": {}},
                {"name": "scripts", "configMap": {"name": f"{REDIS_NAME}-node"}},
            ],
        },
    }
    ports = [
        {"name": "redis", "port": REDIS_PORT, "targetPort": REDIS_PORT},
        {"name": "sentinel", "port": SENTINEL_PORT, "targetPort": SENTINEL_PORT},
    ]
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(f"{REDIS_NAME}-node", options, "redis"),
            "data": {"redis_node.sh": redis_node_script()},
        },
        # headless: each pod keeps its own name in DNS, also before it is ready (the nodes find each other)
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(REDIS_NAME, options, "redis"),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": labels("redis"),
                "ports": ports,
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": _meta(REDIS_NAME, options, "redis"),
            "spec": {
                "serviceName": REDIS_NAME,
                "replicas": SENTINEL_NODES,
                "selector": {"matchLabels": labels("redis")},
                "template": template,
                "volumeClaimTemplates": [_data_volume(options)],
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(REDIS_NAME, options, "redis"),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels("redis")}},
        },
    ]


def flower(options: RenderOptions) -> list[Manifest]:
    """Flower behind basic auth from a Secret; workers run with -E so it sees every event."""
    container = {
        "name": "flower",
        "image": options.image,
        "args": ["celery", "-A", options.app, "flower", "--port=5555", "--persistent=False"],  # auth: the env
        "env": [
            {"name": "FLOWER_BASIC_AUTH", "valueFrom": {"secretKeyRef": {"name": FLOWER_SECRET, "key": "basic-auth"}}},
            *options.broker_env,
        ],
        "ports": [{"containerPort": 5555, "name": "flower"}],
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "250m", "memory": "512Mi"}},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta("sluice-flower", options, "flower"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels("flower")},
            "template": _pod(options, "flower", container),
        },
    }
    return [_service("sluice-flower", options, "flower", 5555), deployment]


def trigger_authentication(options: RenderOptions) -> Manifest:
    """The Redis password for KEDA's triggers (with Sentinel, the Sentinels' too: it is the same)."""
    parameters = ["password", "sentinelPassword"] if options.redis_sentinel else ["password"]
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": _meta(REDIS_AUTH, options, "worker"),
        "spec": {
            "secretTargetRef": [
                {"parameter": parameter, "name": REDIS_SECRET, "key": "password"} for parameter in parameters
            ]
        },
    }


def autoscaler(options: RenderOptions) -> list[Manifest]:
    """For clusters without KEDA: the controller, with the least RBAC it needs (its namespace only)."""
    rules = [
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]},
        {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]},
    ]
    container = {
        "name": "autoscaler",
        "image": options.image,
        "args": [
            "sluice",
            "autoscale",
            "-A",
            options.app,
            "--namespace",
            options.namespace,
            "--metrics-port",
            str(METRICS_PORT),
        ],
        "env": options.broker_env,
        "ports": [{"containerPort": METRICS_PORT, "name": "metrics"}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "100m", "memory": "256Mi"}},
    }
    template = _pod(options, "autoscaler", container, serviceAccountName=AUTOSCALER)
    template["spec"]["automountServiceAccountToken"] = True
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(AUTOSCALER, options, "autoscaler")},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(AUTOSCALER, options, "autoscaler"),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(AUTOSCALER, options, "autoscaler"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AUTOSCALER},
            "subjects": [{"kind": "ServiceAccount", "name": AUTOSCALER, "namespace": options.namespace}],
        },
        _service(AUTOSCALER, options, "autoscaler", METRICS_PORT),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(AUTOSCALER, options, "autoscaler"),
            "spec": {"replicas": 1, "selector": {"matchLabels": labels("autoscaler")}, "template": template},
        },
    ]
