"""Rendered Kubernetes objects: valid, Guaranteed QoS, restricted, secrets referenced, in sync
with deploy/; and apply/diff through the kubernetes client against the HTTP fake."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from sluice.config import Settings
from sluice.deploy.manifests import RenderOptions, render
from sluice.queues.broker.layout import RedisLayout
from sluice.queues.catalog import Catalog
from sluice.units import parse_cpu, parse_memory
from tests.conftest import ROOT
from tests.kube_fake import FakeKube

KEDA = Path(os.environ.get("SLUICE_KEDA_SCHEMAS", ROOT / "tests" / "schemas" / "keda"))
CATALOG = Settings.load(cwd=ROOT, env={}).catalog
FILES = render(CATALOG, RenderOptions())
DOCS = [doc for docs in FILES.values() for doc in docs]
SENTINEL_FILES = render(CATALOG, RenderOptions(redis_sentinel=True))
#: The default ladder with its gpu class shared by two tenants (their queues have triggers too).
SHARED = Catalog.merged({"gpu": {"tenants": {"team-a": {"weight": 3}, "team-b": {"quota": {"gpu": 1}}}}})
SHARED_FILES = render(SHARED, RenderOptions())
SENTINEL_DOCS = [doc for docs in SENTINEL_FILES.values() for doc in docs]
SENTINEL_REDIS = [d for d in SENTINEL_DOCS if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "redis"]


def _id(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("doc", [d for d in DOCS + SENTINEL_REDIS
                                 if not d["apiVersion"].startswith(("keda.sh", "monitoring.coreos.com"))], ids=_id)
@pytest.mark.parametrize("version", ["1.31.0", "1.37.0"])
def test_builtin_objects_validate(doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def _strict(schema: Any) -> Any:
    """Reject unknown fields where the CRD lists the fields (the API server would prune them)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    return schema


def _crd_schema(kind: str) -> dict[str, Any]:
    file = {"ScaledObject": "keda.sh_scaledobjects.yaml", "TriggerAuthentication": "keda.sh_triggerauthentications.yaml"}
    crd = yaml.safe_load((KEDA / file[kind]).read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    return _strict(schema)


@pytest.mark.parametrize("doc", FILES["keda.yaml"] + SENTINEL_FILES["keda.yaml"] + SHARED_FILES["keda.yaml"], ids=_id)
def test_keda_objects_validate_against_kedas_crds(doc: dict[str, Any]) -> None:
    jsonschema.validate(doc, _crd_schema(doc["kind"]))


def test_strict_crd_validation_catches_a_typo() -> None:
    bad = copy.deepcopy(FILES["keda.yaml"][1])
    bad["spec"]["maxReplicas"] = 3
    with pytest.raises(jsonschema.ValidationError, match="maxReplicas"):
        jsonschema.validate(bad, _crd_schema("ScaledObject"))


def _workers() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["labels"]["sluice.dev/class"]: d for d in FILES["sluice.yaml"]
            if d["kind"] == "Deployment" and d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"}


def test_worker_pods_are_guaranteed_qos_sized_by_slots() -> None:
    workers = _workers()
    assert sorted(workers) == sorted(CATALOG.names)
    for rc in CATALOG:
        container = workers[rc.name]["spec"]["template"]["spec"]["containers"][0]
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert requests == limits
        assert parse_cpu(requests["cpu"]) == rc.slot.millicores * rc.slots
        assert parse_memory(requests["memory"]) == rc.slot.memory_bytes * rc.slots
        assert ("nvidia.com/gpu" in limits) == rc.is_gpu
        tolerations = workers[rc.name]["spec"]["template"]["spec"].get("tolerations", [])
        assert (tolerations != []) == rc.is_gpu
        assert container["args"][container["args"].index("--queue") + 1] == rc.name


@pytest.mark.parametrize("docs", [DOCS, SENTINEL_DOCS], ids=["one-redis", "sentinel"])
def test_every_pod_passes_the_restricted_profile(docs: list[dict[str, Any]]) -> None:
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    assert len(pods) == len(CATALOG) + 3      # workers, redis, flower, autoscaler
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    namespace = next(d for d in docs if d["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("docs", [DOCS, SENTINEL_DOCS], ids=["one-redis", "sentinel"])
def test_no_pod_gets_service_link_variables_that_look_like_sluice_settings(docs: list[dict[str, Any]]) -> None:
    """Every pod turns off Kubernetes' service links: otherwise the sluice-redis and sluice-flower
    Services would put SLUICE_REDIS_PORT, SLUICE_FLOWER_SERVICE_HOST and the like into each pod's
    environment, where sluice reads SLUICE_* variables as its settings."""
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    services = [d["metadata"]["name"] for d in docs if d["kind"] == "Service"]
    assert any(name.startswith("sluice-") for name in services)
    assert pods and all(pod.get("enableServiceLinks") is False for pod in pods)


def test_secrets_are_referenced_never_rendered() -> None:
    assert not [d for d in DOCS if d["kind"] == "Secret"]
    text = yaml.safe_dump_all(DOCS)
    assert "secretKeyRef" in text
    redis = next(d for d in DOCS if d["kind"] == "StatefulSet")
    env = redis["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[0]["valueFrom"]["secretKeyRef"] == {"name": "sluice-redis", "key": "password"}
    script = redis["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "--maxmemory-policy noeviction" in script and "--appendonly yes" in script
    flower = next(d for d in DOCS if d["metadata"]["name"] == "sluice-flower" and d["kind"] == "Deployment")
    container = flower["spec"]["template"]["spec"]["containers"][0]
    assert container["env"][0] == {"name": "FLOWER_BASIC_AUTH",
                                   "valueFrom": {"secretKeyRef": {"name": "sluice-flower", "key": "basic-auth"}}}
    # Kubernetes expands $(VAR) into argv, where `ps` in the pod shows it: no secret goes there.
    argvs = [c.get("command", []) + c.get("args", []) for d in DOCS if d["kind"] in ("Deployment", "StatefulSet")
             for c in d["spec"]["template"]["spec"]["containers"]]
    assert not [a for argv in argvs for a in argv if "$(" in a], argvs
    auth = FILES["keda.yaml"][0]
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "password", "name": "sluice-redis", "key": "password"}]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_sentinel_is_one_option_and_every_client_reaches_the_master_through_the_sentinels() -> None:
    """--sentinel swaps the one Redis for a StatefulSet of three nodes (a Redis and a Sentinel
    each, the node script from the package) and points every client — workers, Flower, the
    autoscaler, KEDA — at exactly those Sentinels under the master set name the nodes use, with the
    Sentinels' password from the Secret. Nothing else in the topology changes."""
    from sluice import redis_client
    from sluice.deploy.platform import redis_node_script

    (statefulset,) = [d for d in SENTINEL_DOCS if d["kind"] == "StatefulSet"]
    spec = statefulset["spec"]
    redis_container, sentinel_container = spec["template"]["spec"]["containers"]
    node_env = _env(redis_container)
    pods = [f"{statefulset['metadata']['name']}-{i}.{spec['serviceName']}.sluice.svc:26379"
            for i in range(spec["replicas"])]
    assert spec["replicas"] == 3 and _env(sentinel_container) == node_env
    assert [f"{n}:26379" for n in node_env["NODES"].split()] == pods
    (service,) = [d for d in SENTINEL_DOCS if d["kind"] == "Service" and d["metadata"]["name"] == spec["serviceName"]]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    (configmap,) = [d for d in SENTINEL_DOCS if d["kind"] == "ConfigMap"]
    assert configmap["data"] == {"redis_node.sh": redis_node_script()}

    clients = [c for d in SENTINEL_DOCS if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]]
    assert len(clients) == len(CATALOG) + 2
    for container in clients:
        env = _env(container)
        nodes, _ = redis_client.sentinel_nodes(env["SLUICE_BROKER_URL"].replace("$(REDIS_PASSWORD)", "pw"))
        assert [f"{host}:{port}" for host, port in nodes] == pods
        assert env["SLUICE_SENTINEL_MASTER"] == node_env["MASTER_SET"]
        assert env["SLUICE_SENTINEL_PASSWORD"] == env["REDIS_PASSWORD"] == node_env["REDIS_PASSWORD"]
    auth, *scaled = SENTINEL_FILES["keda.yaml"]
    assert {r["parameter"] for r in auth["spec"]["secretTargetRef"]} == {"password", "sentinelPassword"}
    for so in scaled:
        for trigger in so["spec"]["triggers"]:
            assert trigger["type"] == "redis-sentinel"
            assert trigger["metadata"]["addresses"].split(",") == pods
            assert trigger["metadata"]["sentinelMaster"] == node_env["MASTER_SET"]
    rest = [(d["kind"], d["metadata"]["name"]) for d in SENTINEL_DOCS if d["metadata"].get("labels", {}).get(
        "app.kubernetes.io/component") != "redis"]
    assert rest == [(d["kind"], d["metadata"]["name"]) for d in DOCS if d["metadata"].get("labels", {}).get(
        "app.kubernetes.io/component") != "redis"]


def test_render_sentinel_flag_prints_the_sentinel_topology() -> None:
    out = subprocess.run([sys.executable, "-m", "sluice", "deploy", "render", "--sentinel"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert [doc for doc in yaml.safe_load_all(out.stdout) if doc] == SENTINEL_DOCS
    refused = subprocess.run([sys.executable, "-m", "sluice", "deploy", "compose", "--sentinel"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert refused.returncode == 2 and "--sentinel is for Kubernetes" in refused.stderr


def test_scaled_objects_follow_the_catalog() -> None:
    for rc, so in zip(CATALOG, FILES["keda.yaml"][1:]):
        assert so["spec"]["scaleTargetRef"]["name"] == f"sluice-worker-{rc.name}"
        assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (rc.min_replicas, rc.max_replicas)
        assert [t["metadata"]["listName"] for t in so["spec"]["triggers"]] == [
            *RedisLayout().queue_lists(rc.name), RedisLayout().parked_count(rc.name)]


def test_a_scaled_object_sums_a_trigger_per_list_of_every_tenant_the_class_names() -> None:
    """KEDA's Redis trigger reads one list: the gpu class's backlog is the sum, by KEDA's scaling
    modifiers, of a trigger on each priority list of its own queue and of each named tenant's,
    and on the count of its messages parked on rate limits."""
    gpu = next(so for so in SHARED_FILES["keda.yaml"][1:] if so["metadata"]["name"] == "sluice-worker-gpu")
    triggers = gpu["spec"]["triggers"]
    lists = [list_ for queue in ("gpu", "gpu~team-a", "gpu~team-b") for list_ in RedisLayout().queue_lists(queue)]
    lists.append(RedisLayout().parked_count("gpu"))
    assert [t["metadata"]["listName"] for t in triggers] == lists
    modifiers = gpu["spec"]["advanced"]["scalingModifiers"]
    assert modifiers["formula"] == " + ".join(t["name"] for t in triggers)
    assert modifiers["target"] == "1" and modifiers["metricType"] == "AverageValue"


def test_checked_in_manifests_match_what_the_code_renders(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "sluice", "deploy", "render", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    for name in FILES:
        assert (ROOT / "deploy" / name).read_text() == (tmp_path / name).read_text(), \
            f"deploy/{name} drifted: run `sluice deploy render --out deploy`"


def test_render_without_out_prints_every_object_to_stdout() -> None:
    out = subprocess.run([sys.executable, "-m", "sluice", "deploy", "render"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    printed = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    assert [(d["kind"], d["metadata"]["name"]) for d in printed] == [(d["kind"], d["metadata"]["name"]) for d in DOCS]


def test_apply_is_idempotent_and_diff_shows_changes(tmp_path: Path) -> None:
    with FakeKube() as fake:
        env = os.environ | {"KUBECONFIG": str(fake.kubeconfig(tmp_path / "kubeconfig")), "PYTHONPATH": str(ROOT)}

        def sluice(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "sluice", "deploy", *args], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=60)

        dry = sluice("apply", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "Deployment/sluice-worker-cpu created (dry run)" in dry.stdout and fake.objects == {}
        first = sluice("apply")
        assert first.stdout.count(" created") == len(FILES["sluice.yaml"]) + len(FILES["keda.yaml"])
        assert "/apis/keda.sh/v1alpha1/namespaces/sluice/scaledobjects/sluice-worker-gpu" in fake.objects
        second = sluice("apply")
        assert second.stdout.count(" unchanged") == len(FILES["sluice.yaml"]) + len(FILES["keda.yaml"])
        assert sluice("diff").returncode == 0
        changed = sluice("diff", "--image", "example/sluice:2")
        assert changed.returncode == 1
        assert "-        image: ghcr.io/sluice-dev/sluice:0.1.0" in changed.stdout
        assert "+        image: example/sluice:2" in changed.stdout


def test_a_packed_class_pod_is_the_class_size_and_validates() -> None:
    """A packed class's slot is the whole worker: the pod is that size (not slot x slots)."""
    from sluice.queues.catalog import Catalog

    catalog = Catalog.merged({"packed": {"cpu": "4", "memory": "8Gi", "slots": 16, "pack": True}})
    docs = [doc for docs in render(catalog, RenderOptions()).values() for doc in docs]
    worker = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "sluice-worker-packed")
    resources = worker["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "4", "memory": "8Gi"}
    kubernetes_validate.validate(worker, "1.31.0", strict=True)


def _sluice_cli(*args: str, env: dict[str, str], hide_kubernetes: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the ``sluice`` entry point (the one users run, with its error handling); with
    ``hide_kubernetes`` the kubernetes package cannot be imported, as without the extra."""
    hide = "sys.modules['kubernetes'] = None; " if hide_kubernetes else ""
    code = f"import sys; {hide}sys.argv = ['sluice', *sys.argv[1:]]; from sluice.cli import run; run()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=90,
                          env=os.environ | {"PYTHONPATH": str(ROOT), "COLUMNS": "300"} | env)


@pytest.mark.parametrize("command", [["deploy", "diff"], ["deploy", "apply"], ["autoscale", "-A", "sluice.demo"]],
                         ids=["diff", "apply", "autoscale"])
def test_no_kubeconfig_is_one_line_and_exit_69(tmp_path: Path, command: list[str]) -> None:
    """Without a kubeconfig (and not in a pod) each cluster command says so in one line and
    exits 69, not 1 (which `diff` uses for "there are changes") and not with a traceback."""
    out = _sluice_cli(*command, env={"KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path)})
    assert out.returncode == 69, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no cluster to talk to" in lines[0] and "KUBECONFIG" in lines[0], out.stderr


@pytest.mark.parametrize("command", [["deploy", "diff"], ["autoscale", "-A", "sluice.demo", "--metrics-port", "0"]],
                         ids=["diff", "autoscale"])
def test_an_api_server_that_does_not_answer_is_one_line_and_exit_69(tmp_path: Path, command: list[str]) -> None:
    """A kubeconfig pointing at a port nothing listens on: one line naming the server, exit 69."""
    from sluice.deploy.embedded import free_port

    with FakeKube() as fake:
        kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig")
    dead = f"http://127.0.0.1:{free_port()}"
    kubeconfig.write_text(kubeconfig.read_text().replace(fake.url, dead))
    out = _sluice_cli(*command, env={"KUBECONFIG": str(kubeconfig)})
    assert out.returncode == 69, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert f"the Kubernetes API server at {dead} does not answer" in out.stderr


def test_without_the_kubernetes_extra_the_deploy_commands_name_it(tmp_path: Path) -> None:
    """kubernetes is an extra: without it `sluice deploy apply` says which extra to install,
    while render (pure YAML) and the rest of sluice work without it."""
    out = _sluice_cli("deploy", "apply", env={}, hide_kubernetes=True)
    assert out.returncode == 2 and "pip install 'sluice[kubernetes]'" in out.stderr, out.stdout + out.stderr
    rendered = _sluice_cli("deploy", "render", "--out", str(tmp_path), env={}, hide_kubernetes=True)
    assert rendered.returncode == 0 and (tmp_path / "sluice.yaml").exists(), rendered.stdout + rendered.stderr
    imports = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['kubernetes'] = None; import sluice, sluice.cli, "
         "sluice.deploy.local, sluice.deploy.metrics, sluice.workers.bootstep"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert imports.returncode == 0, imports.stderr
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("kubernetes") for dep in project["dependencies"])
    assert any(dep.startswith("kubernetes") for dep in project["optional-dependencies"]["kubernetes"])
