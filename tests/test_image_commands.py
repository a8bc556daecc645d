"""Every command the rendered manifests and docker-compose.yml run in sluice's image works in the
image the Dockerfile builds.

No container engine runs here, so the image is rebuilt as a fresh virtualenv: the files the
Dockerfile copies, installed with the Dockerfile's own ``pip install`` line. Each container
command (and exec probe) then runs from that virtualenv, with nothing of this checkout on its
path, far enough to show that nothing it imports is missing: workers beat, their probes pass, the
demo's tasks come back, Flower answers, and the autoscaler reads the cluster (an HTTP fake of the
Kubernetes API) and serves its metrics.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml

from sluice import keys
from sluice.deploy.embedded import EmbeddedRedis, free_port
from tests.conftest import ROOT, wait_for
from tests.kube_fake import FakeKube

DOCKERFILE = ROOT / "Dockerfile"
#: Each kind of container command we run, by its program and a word that follows it; the
#: integration test knows how to run each kind. A command of a new kind fails the fast test until
#: the runner learns it.
KINDS = {"worker": ("sluice", "worker"), "probe": ("sluice", "check"), "autoscaler": ("sluice", "autoscale"),
         "demo": ("python", "sluice.demo"), "flower": ("celery", "flower")}


def image_install_spec() -> tuple[list[str], str]:
    """The files the Dockerfile copies into the image, and what its ``pip install`` installs."""
    text = DOCKERFILE.read_text()
    copied = [part for line in re.findall(r"^COPY (.+) \S+$", text, re.M) for part in line.split()]
    match = re.search(r"^RUN pip install (\S+)", text, re.M)
    assert match, "the Dockerfile has no `RUN pip install ...` line"
    return copied, match[1].strip("'\"")


def container_commands() -> list[list[str]]:
    """Every distinct command (container command and exec probe) that runs in sluice's image,
    from the rendered manifests and docker-compose.yml; Redis's own image is not ours."""
    found: list[list[str]] = []
    for path in sorted((ROOT / "deploy").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = ((doc or {}).get("spec") or {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []) + spec.get("initContainers", []):
                if "sluice" not in container.get("image", ""):
                    continue
                found.append((container.get("command") or []) + (container.get("args") or []))
                for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                    found.append(((container.get(probe) or {}).get("exec") or {}).get("command") or [])
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for service in compose["services"].values():
        if "sluice" in str(service.get("image", "")) or "build" in service:
            command = service.get("command") or []
            found.append(command.split() if isinstance(command, str) else command)
            test = (service.get("healthcheck") or {}).get("test") or []
            found.append([word for word in test if word not in ("CMD", "CMD-SHELL")])
    distinct: list[list[str]] = []
    for command in found:
        if command and command not in distinct:
            distinct.append(command)
    return distinct


def kind_of(command: list[str]) -> str | None:
    for kind, (program, word) in KINDS.items():
        if command[0] == program and word in command[1:]:
            return kind
    return None


def test_every_container_command_is_of_a_kind_the_image_test_runs() -> None:
    """The image test below runs each kind of command; one of another kind would go unchecked."""
    commands = container_commands()
    assert {kind_of(c) for c in commands} == set(KINDS), commands
    assert all(kind_of(c) for c in commands), [c for c in commands if not kind_of(c)]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding what the image holds: the copied files, installed as the
    Dockerfile installs them (pip, no editable install, none of the test extras)."""
    root = tmp_path_factory.mktemp("image")
    copied, spec = image_install_spec()
    source = root / "opt-sluice"
    source.mkdir()
    for name in copied:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, source / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", spec], cwd=source,
                             capture_output=True, text=True, timeout=100)
    assert install.returncode == 0, install.stderr[-3000:]
    return venv / "bin"


class Running:
    """Container commands started from the image's virtualenv, outside this checkout."""

    def __init__(self, bin_dir: Path, work: Path) -> None:
        self.work = work
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.env |= {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(work), "SLUICE_HOME": str(work / "home")}
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, command: list[str], name: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(self.work / f"{name}.log", "ab") as log:
            process = subprocess.Popen(command, cwd=self.work, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, env=self.env | (env or {}))
        self.processes.append(process)
        return process

    def run(self, command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, cwd=self.work, capture_output=True, text=True, timeout=timeout, env=self.env)

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")

    def alive(self, process: subprocess.Popen[bytes], name: str) -> None:
        assert process.poll() is None, f"{name} exited {process.returncode}:\n{self.log(name)[-3000:]}"

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@pytest.fixture
def running(image: Path, tmp_path: Path) -> Iterator[Running]:
    commands = Running(image, tmp_path)
    yield commands
    commands.stop()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _with_port(command: list[str], option: str, port: int) -> list[str]:
    """The command with its ``option`` port replaced by a free one (both ``--opt=N`` and ``--opt N``)."""
    out = [f"{option}={port}" if word.startswith(f"{option}=") else word for word in command]
    if option in out:
        out[out.index(option) + 1] = str(port)
    return out


def test_every_container_command_runs_in_the_image_the_dockerfile_builds(
        redis_server: EmbeddedRedis, running: Running) -> None:
    """Each command of the manifests and the compose file, run from a virtualenv installed as the
    Dockerfile installs sluice, gets far enough to show it has everything it imports."""
    client: redis.Redis = redis_server.client()
    client.flushdb()
    commands = container_commands()
    by_kind = {kind: [c for c in commands if kind_of(c) == kind] for kind in KINDS}
    host = socket.gethostname()

    workers = {}
    for n, command in enumerate(by_kind["worker"]):
        name = command[command.index("-n") + 1].replace("%h", host)
        workers[name] = running.start(command, f"worker-{n}", env={"SLUICE_GPU_COUNT": "1"})
    for n, (name, process) in enumerate(workers.items()):
        wait_for(lambda: process.poll() is not None or client.exists(keys.worker_heartbeat(name)), 90,
                 f"worker {name} to beat")
        running.alive(process, f"worker-{n}")
    for command in by_kind["probe"]:
        probe = running.run(command, timeout=60)
        assert probe.returncode == 0, (command, probe.stdout, probe.stderr)
    for command in by_kind["demo"]:
        demo = running.run(command, timeout=90)
        assert demo.returncode == 0 and "skipped" not in demo.stdout, (command, demo.stdout, demo.stderr[-3000:])

    for n, command in enumerate(by_kind["flower"]):
        port = free_port()
        process = running.start(_with_port(command, "--port", port), f"flower-{n}")
        wait_for(lambda: process.poll() is not None or _answers(f"http://127.0.0.1:{port}/healthcheck"), 60,
                 "Flower to answer")
        running.alive(process, f"flower-{n}")

    with FakeKube() as kube:
        namespace = by_kind["autoscaler"][0][by_kind["autoscaler"][0].index("--namespace") + 1]
        for class_name in ("cpu", "highmem", "gpu"):
            kube.add_deployment(namespace, f"sluice-worker-{class_name}", 1)
        kubeconfig = kube.kubeconfig(running.work / "kubeconfig")
        for n, command in enumerate(by_kind["autoscaler"]):
            port = free_port()
            process = running.start(_with_port(command, "--metrics-port", port), f"autoscaler-{n}",
                                    env={"KUBECONFIG": str(kubeconfig)})
            wait_for(lambda: process.poll() is not None or _answers(f"http://127.0.0.1:{port}/metrics"), 60,
                     "the autoscaler's metrics")
            wait_for(lambda: process.poll() is not None or any("deployments" in path for _, path in kube.requests),
                     30, "the autoscaler to read the worker Deployments")
            running.alive(process, f"autoscaler-{n}")
