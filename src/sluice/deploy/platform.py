"""The objects around the workers: Namespace, Redis, Flower, KEDA auth, the built-in autoscaler.

Secrets are referenced, never rendered: create them once (see the README's Kubernetes section).
Every pod passes the "restricted" Pod Security Standard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.deploy.manifests import RenderOptions

Manifest = dict[str, Any]

REDIS_NAME = "sluice-redis"
REDIS_SECRET = "sluice-redis"        #: key "password"
REDIS_AUTH = "sluice-redis-auth"     #: the KEDA TriggerAuthentication
REMOTE_SECRET = "sluice-remote"      #: key "secret": signs every pickle sent through Redis (optional)
FLOWER_SECRET = "sluice-flower"      #: key "basic-auth", "user:password"
AUTOSCALER = "sluice-autoscaler"
METRICS_PORT = 9100

POD_SECURITY: Manifest = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                          "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY: Manifest = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                                "seccompProfile": {"type": "RuntimeDefault"}}


def labels(component: str, resource_class: str | None = None) -> dict[str, str]:
    """The labels every sluice object carries (selectors use them too)."""
    out = {"app.kubernetes.io/name": "sluice", "app.kubernetes.io/component": component}
    if resource_class:
        out["sluice.dev/class"] = resource_class
    return out


def _meta(name: str, options: RenderOptions, component: str) -> Manifest:
    return {"name": name, "namespace": options.namespace, "labels": labels(component)}


def _pod(options: RenderOptions, component: str, container: Manifest, **extra: Any) -> Manifest:
    container = {"securityContext": CONTAINER_SECURITY,
                 "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}], **container}
    return {"metadata": {"labels": labels(component)},
            "spec": {"securityContext": POD_SECURITY, "automountServiceAccountToken": False,
                     "containers": [container], "volumes": [{"name": "tmp", "emptyDir": {}}], **extra}}


def _service(name: str, options: RenderOptions, component: str, port: int) -> Manifest:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, options, component),
            "spec": {"selector": labels(component), "ports": [{"name": component, "port": port, "targetPort": port}]}}


def namespace(options: RenderOptions) -> Manifest:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": options.namespace, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}


def redis_command() -> list[str]:
    """Redis with AOF in /data and no eviction (a queue must never silently lose messages to make
    room), its password from ``$REDIS_PASSWORD`` fed to it as config on stdin: a printf of the
    shell's own is no process, so the password is in no argv for ``ps`` to show. The image's
    entrypoint still runs (it drops root to the redis user where it starts as root, in compose)."""
    return ["sh", "-c", 'printf "requirepass %s\\n" "$REDIS_PASSWORD" | exec docker-entrypoint.sh redis-server - '
            "--appendonly yes --dir /data --maxmemory-policy noeviction"]


def redis(options: RenderOptions) -> list[Manifest]:
    """Redis (see :func:`redis_command`) on a persistent volume, its password from the Secret."""
    password = {"valueFrom": {"secretKeyRef": {"name": REDIS_SECRET, "key": "password"}}}
    container = {
        "name": "redis", "image": "redis:7.2",
        "command": redis_command(),
        "env": [{"name": "REDIS_PASSWORD", **password}, {"name": "REDISCLI_AUTH", **password}],
        "ports": [{"containerPort": 6379, "name": "redis"}],
        "readinessProbe": {"exec": {"command": ["redis-cli", "ping"]}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1Gi"}},
    }
    template = _pod(options, "redis", container)
    template["spec"]["containers"][0]["volumeMounts"].append({"name": "data", "mountPath": "/data"})
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(REDIS_NAME, options, "redis"),
        "spec": {"serviceName": REDIS_NAME, "replicas": 1, "selector": {"matchLabels": labels("redis")},
                 "template": template,
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                     "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": options.redis_storage}}}}]},
    }
    return [_service(REDIS_NAME, options, "redis", 6379), statefulset]


def flower(options: RenderOptions) -> list[Manifest]:
    """Flower behind basic auth from a Secret; workers run with -E so it sees every event."""
    container = {
        "name": "flower", "image": options.image,
        "args": ["celery", "-A", options.app, "flower", "--port=5555", "--persistent=False"],   # auth: the env
        "env": [{"name": "FLOWER_BASIC_AUTH", "valueFrom": {"secretKeyRef": {"name": FLOWER_SECRET,
                                                                            "key": "basic-auth"}}},
                *options.broker_env],
        "ports": [{"containerPort": 5555, "name": "flower"}],
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "250m", "memory": "512Mi"}},
    }
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta("sluice-flower", options, "flower"),
                  "spec": {"replicas": 1, "selector": {"matchLabels": labels("flower")},
                           "template": _pod(options, "flower", container)}}
    return [_service("sluice-flower", options, "flower", 5555), deployment]


def trigger_authentication(options: RenderOptions) -> Manifest:
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication",
            "metadata": _meta(REDIS_AUTH, options, "worker"),
            "spec": {"secretTargetRef": [{"parameter": "password", "name": REDIS_SECRET, "key": "password"}]}}


def autoscaler(options: RenderOptions) -> list[Manifest]:
    """For clusters without KEDA: the controller, with the least RBAC it needs (its namespace only)."""
    rules = [
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]},
        {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]},
    ]
    container = {
        "name": "autoscaler", "image": options.image,
        "args": ["sluice", "autoscale", "-A", options.app, "--namespace", options.namespace,
                 "--metrics-port", str(METRICS_PORT)],
        "env": options.broker_env,
        "ports": [{"containerPort": METRICS_PORT, "name": "metrics"}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "100m", "memory": "256Mi"}},
    }
    template = _pod(options, "autoscaler", container, serviceAccountName=AUTOSCALER)
    template["spec"]["automountServiceAccountToken"] = True
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(AUTOSCALER, options, "autoscaler")},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(AUTOSCALER, options, "autoscaler"),
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(AUTOSCALER, options, "autoscaler"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AUTOSCALER},
         "subjects": [{"kind": "ServiceAccount", "name": AUTOSCALER, "namespace": options.namespace}]},
        _service(AUTOSCALER, options, "autoscaler", METRICS_PORT),
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(AUTOSCALER, options, "autoscaler"),
         "spec": {"replicas": 1, "selector": {"matchLabels": labels("autoscaler")}, "template": template}},
    ]
