"""``sluice deploy compose``: docker-compose.yml for the same topology, sized from the catalog.

Redis (AOF, password, healthcheck, noeviction), one worker service per class with the pod's
cpu/memory as limits (the gpu class in the ``gpu`` profile with a device reservation), Flower
with basic auth, and an example app service that calls ``.delay()``.
"""

from __future__ import annotations

from typing import Any

from sluice.config.sources import FLOWER_AUTH_ENV, REDIS_PASSWORD_ENV
from sluice.deploy.manifests import RenderOptions, pod_resources, worker_command
from sluice.deploy.platform import redis_command
from sluice.queues.catalog import Catalog, ResourceClass
from sluice.units import parse_cpu, parse_memory

#: Compose refuses to start without them (no default password): ``${VAR:?message}``.
PASSWORD = f"${{{REDIS_PASSWORD_ENV}:?set {REDIS_PASSWORD_ENV}, the password Redis will require}}"
FLOWER_AUTH = f"${{{FLOWER_AUTH_ENV}:?set {FLOWER_AUTH_ENV}, Flower's basic auth as user:password}}"
BROKER = f"redis://:{PASSWORD}@redis:6379/0"
#: Signs remote calls; empty (the default) means the workers run none.
REMOTE_SECRET = "${SLUICE_REMOTE_SECRET:-}"


def _worker(rc: ResourceClass, options: RenderOptions) -> dict[str, Any]:
    amounts = pod_resources(rc)
    service: dict[str, Any] = {
        "image": "sluice:dev",
        "build": {"context": "."},
        "command": worker_command(rc, options),
        "environment": {"SLUICE_BROKER_URL": BROKER, "SLUICE_REMOTE_SECRET": REMOTE_SECRET},
        "depends_on": {"redis": {"condition": "service_healthy"}},
        "stop_grace_period": f"{options.grace_seconds + 60}s",
        "read_only": True,
        "tmpfs": ["/tmp"],
        "deploy": {
            "resources": {
                "limits": {
                    "cpus": str(parse_cpu(amounts["cpu"]) / 1000),
                    "memory": f"{parse_memory(amounts['memory'])}b",
                }
            }
        },
    }
    if rc.is_gpu:
        service["profiles"] = ["gpu"]
        service["deploy"]["resources"]["reservations"] = {
            "devices": [{"driver": "nvidia", "count": rc.worker_size.gpus, "capabilities": ["gpu"]}]
        }
    return service


def render_compose(catalog: Catalog, options: RenderOptions) -> dict[str, Any]:
    services: dict[str, Any] = {
        "redis": {
            "image": "redis:7.2",
            "command": [part.replace("$", "$$") for part in redis_command()],  # $$: a literal $ for the shell
            "environment": {"REDIS_PASSWORD": PASSWORD, "REDISCLI_AUTH": PASSWORD},
            "volumes": ["redis-data:/data"],
            "healthcheck": {"test": ["CMD", "redis-cli", "ping"], "interval": "5s", "timeout": "3s", "retries": 10},
        },
        **{f"worker-{rc.name}": _worker(rc, options) for rc in catalog},
        "flower": {
            "image": "sluice:dev",
            "command": ["celery", "-A", options.app, "flower", "--port=5555"],
            "environment": {"SLUICE_BROKER_URL": BROKER, "FLOWER_BASIC_AUTH": FLOWER_AUTH},
            "ports": ["127.0.0.1:5555:5555"],
            "depends_on": {"redis": {"condition": "service_healthy"}},
        },
        "app": {
            "image": "sluice:dev",
            "command": ["python", "-m", "sluice.demo", "--wait-for-workers", "120"],
            "environment": {"SLUICE_BROKER_URL": BROKER},
            "depends_on": {"redis": {"condition": "service_healthy"}},
        },
    }
    return {"name": "sluice", "services": services, "volumes": {"redis-data": {}}}
