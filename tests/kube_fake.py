"""A small HTTP fake of the Kubernetes API endpoints sluice uses (no API server can run here).

It stores objects by REST path and implements: GET of an object or a collection (with
labelSelector), server-side apply and merge PATCH (with dryRun), and the Deployment scale
subresource (GET/PATCH), recording every scale change with its time.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse


def merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base.get(key), value) if value is not None else None
        return {k: v for k, v in out.items() if v is not None}
    return copy.deepcopy(patch)


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.scales: list[tuple[float, str, int]] = []   # (time, deployment path, replicas)
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeKube:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        return path

    def put(self, path: str, obj: dict[str, Any]) -> None:
        self.objects[path] = obj

    def add_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        self.put(f"/api/v1/namespaces/{namespace}/pods/{name}",
                 {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                                   "labels": labels, "annotations": {}}})

    def add_deployment(self, namespace: str, name: str, replicas: int) -> None:
        self.put(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
                 {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": name, "namespace": namespace}, "spec": {"replicas": replicas}})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _missing(self, path: str) -> None:
                self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                 "code": 404, "message": f"{path} not found"})

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                url = urlparse(self.path)
                fake.requests.append(("GET", url.path))
                with fake.lock:
                    if url.path.endswith("/scale"):
                        return self._scale(url.path[: -len("/scale")], None)
                    if url.path in fake.objects:
                        return self._send(200, fake.objects[url.path])
                    prefix = url.path + "/"
                    items = [o for p, o in fake.objects.items() if p.startswith(prefix) and "/" not in p[len(prefix):]]
                    if items or url.path.endswith(("/pods", "/deployments")):
                        wanted = dict(pair.split("=", 1) for s in parse_qs(url.query).get("labelSelector", [])
                                      for pair in s.split(","))
                        chosen = [o for o in items if wanted.items() <= o["metadata"].get("labels", {}).items()]
                        return self._send(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": chosen})
                    return self._missing(url.path)

            def do_PATCH(self) -> None:  # noqa: N802
                url = urlparse(self.path)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(("PATCH", url.path))
                dry_run = "dryRun" in parse_qs(url.query)
                with fake.lock:
                    if url.path.endswith("/scale"):
                        return self._scale(url.path[: -len("/scale")], body["spec"]["replicas"])
                    apply = self.headers["Content-Type"].startswith("application/apply-patch")
                    if url.path not in fake.objects and not apply:
                        return self._missing(url.path)
                    merged = merge(fake.objects.get(url.path, {}), body)
                    if not dry_run:
                        fake.objects[url.path] = merged
                    return self._send(200, merged)

            def _scale(self, path: str, replicas: int | None) -> None:
                deployment = fake.objects.get(path)
                if deployment is None:
                    return self._missing(path)
                if replicas is not None and replicas != deployment["spec"]["replicas"]:
                    deployment["spec"]["replicas"] = replicas
                    fake.scales.append((time.time(), path, replicas))
                meta = deployment["metadata"]
                current = deployment["spec"]["replicas"]
                return self._send(200, {"apiVersion": "autoscaling/v1", "kind": "Scale",
                                        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                                        "spec": {"replicas": current}, "status": {"replicas": current}})

        return Handler
