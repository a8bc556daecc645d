"""``sluice deploy apply`` / ``diff``: rendered objects against a cluster, with the kubernetes client.

Apply is server-side apply (one PATCH per object, ``fieldManager=sluice``): it creates what is
missing and updates what changed, so running it twice changes nothing. ``--dry-run`` asks the
API server to validate without persisting (``dryRun=All``).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from sluice.deploy.manifests import to_yaml
from sluice.errors import ConfigurationError

Manifest = dict[str, Any]

PLURALS = {
    "Namespace": "namespaces",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
    "Secret": "secrets",
    "StatefulSet": "statefulsets",
    "Deployment": "deployments",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ScaledObject": "scaledobjects",
    "TriggerAuthentication": "triggerauthentications",
}


def object_path(manifest: Manifest) -> str:
    """The REST path of one object (``/api/v1/namespaces/x``, ``/apis/apps/v1/namespaces/ns/deployments/y``)."""
    kind, api_version, meta = manifest["kind"], manifest["apiVersion"], manifest["metadata"]
    if kind not in PLURALS:
        raise ConfigurationError(f"sluice cannot apply kind {kind!r}; it applies {', '.join(PLURALS)}")
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if kind == "Namespace":
        return f"{prefix}/namespaces/{meta['name']}"
    return f"{prefix}/namespaces/{meta['namespace']}/{PLURALS[kind]}/{meta['name']}"


def _call(
    api: k8s.ApiClient,
    method: str,
    path: str,
    body: str | None = None,
    query: list[tuple[str, str]] | None = None,
    content_type: str = "application/json",
) -> Any:
    """One request through the client's own auth, TLS and host settings; JSON in, JSON out."""
    method, url, headers, body, _ = api.param_serialize(
        method,
        path,
        query_params=query or [],
        body=body,
        auth_settings=["BearerToken"],
        header_params={"Content-Type": content_type, "Accept": "application/json"},
    )
    response = api.call_api(method, url, header_params=headers, body=body)
    data = response.read()
    if response.status >= 400:
        raise ApiException(http_resp=response)
    return json.loads(data)


def live(api: k8s.ApiClient, manifest: Manifest) -> Manifest | None:
    """The object as the cluster has it, or None."""
    try:
        return _call(api, "GET", object_path(manifest))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def apply(api: k8s.ApiClient, manifests: Iterable[Manifest], dry_run: bool = False) -> list[tuple[str, str]]:
    """Server-side apply each object; returns (``kind/name``, ``created``/``configured``/``unchanged``)."""
    done = []
    for manifest in manifests:
        before = live(api, manifest)
        query = [("fieldManager", "sluice"), ("force", "true")] + ([("dryRun", "All")] if dry_run else [])
        after = _call(
            api,
            "PATCH",
            object_path(manifest),
            body=json.dumps(manifest),
            query=query,
            content_type="application/apply-patch+yaml",
        )
        state = (
            "created"
            if before is None
            else ("unchanged" if _project(before, manifest) == _project(after, manifest) else "configured")
        )
        done.append((f"{manifest['kind']}/{manifest['metadata']['name']}", state + (" (dry run)" if dry_run else "")))
    return done


def diff(api: k8s.ApiClient, manifests: Iterable[Manifest]) -> str:
    """A unified diff, per object, of the fields sluice sets: live (or nothing) -> rendered."""
    chunks: list[str] = []
    for manifest in manifests:
        current = live(api, manifest)
        name = f"{manifest['kind']}/{manifest['metadata']['name']}"
        before = "" if current is None else to_yaml([_project(current, manifest)], sort_keys=True)
        after = to_yaml([manifest], sort_keys=True)
        chunks.extend(
            difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"live/{name}", f"rendered/{name}")
        )
    return "".join(chunks)


def _project(live_value: Any, desired: Any) -> Any:
    """The part of a live object that the rendered one speaks of (the server adds fields)."""
    if isinstance(desired, dict) and isinstance(live_value, dict):
        return {k: _project(live_value[k], v) for k, v in desired.items() if k in live_value}
    if isinstance(desired, list) and isinstance(live_value, list) and len(desired) == len(live_value):
        return [_project(lv, dv) for lv, dv in zip(live_value, desired)]
    return live_value
