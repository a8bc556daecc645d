"""The connection to a Kubernetes cluster for ``sluice deploy apply|diff`` and ``sluice autoscale``.

The kubernetes client is an extra (``sluice[kubernetes]``): a user who never deploys does not
install it. Every way of not reaching a cluster (the extra missing, no kubeconfig, an API server
that does not answer) is one :class:`~sluice.errors.ClusterUnavailable` line, not a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sluice.errors import ClusterUnavailable, MissingExtra

EXTRA = "sluice[kubernetes]"


def require_kubernetes(command: str) -> None:
    """Raise :class:`MissingExtra` naming the extra when the kubernetes client is not installed."""
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        raise MissingExtra(
            f"`{command}` needs the kubernetes client, which is not installed: pip install '{EXTRA}'"
        ) from None


def connect(command: str) -> Any:  # kubernetes.client.ApiClient
    """In a pod: the service account; elsewhere: the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    require_kubernetes(command)
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise ClusterUnavailable(
                f"`{command}` found no cluster to talk to: not in a pod, and no usable "
                f"kubeconfig ({exc}); set KUBECONFIG or write ~/.kube/config"
            ) from None
    return client.ApiClient()


@contextmanager
def reaching(api: Any) -> Iterator[None]:
    """Turn a cluster that does not answer into one :class:`ClusterUnavailable` line naming it."""
    import urllib3

    try:
        yield
    except urllib3.exceptions.HTTPError as exc:
        raise ClusterUnavailable(
            f"the Kubernetes API server at {api.configuration.host} does not answer: "
            f"{type(exc).__name__}: {_reason(exc)}"
        ) from None


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc).splitlines()[0]
