"""Remote call latency, side by side in one run: a no-op ``@sluice.remote`` call with no packages,
with a cached package environment, and with a fresh install every call (the reference's
behaviour: ``fresh_env_per_call`` with uv's own cache off, as a fresh sandbox has none), calls in
a ``sluice.session`` (one sandbox kept warm), and the
same no-op through Ray (``ray.remote`` with ``runtime_env={"pip": [...]}``; Ray caches that
environment too) when Ray is installed. The package is a real one the base environment lacks
(pandas, with its dependencies, unless the base has it), whose wheels are fetched once with
``pip download`` and then installed from that directory with no index, so the figures measure
installs, not the network; without a registry a small wheel built here stands in. The JSON
says which package was used. Prints one JSON line.

Beside them, a no-op task's ``.delay().get()`` round trip on the same worker: the floor a
remote call adds its sandbox to.

Usage: python bench/remote.py [--calls 40]
Goals: a cached-environment call under 100 ms median, at least 10x faster than a fresh install,
and a no-op remote call (with or without a cached environment) within 3x of ``.delay().get()``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

from sluice.deploy.embedded import EmbeddedRedis  # noqa: E402
from tests.wheels import build_wheel  # noqa: E402


def figures(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered) * 1000, 1),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1000, 1), "n": len(ordered)}


def timed(call: Callable[[], Any], runs: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


def start_worker(queue: str, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sluice", "worker", "-A", "bench.apps:sluice_app", "--queue", queue, "-n", f"{name}@bench",
         "--without-mingle", "--without-gossip", "--loglevel", "WARNING"],
        cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for_workers(client: Any, names: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all(client.exists(f"sluice:worker:{n}@bench") for n in names):
        if time.monotonic() > deadline:
            raise SystemExit(f"workers {names} did not start")
        time.sleep(0.1)


#: Real packages to install, the first one the base environment lacks is used (a package the
#: base provides would be left out, and nothing installed).
CANDIDATES = ("pandas==2.2.3", "sympy==1.14.0", "openpyxl==3.1.5")


def fill_wheelhouse(wheelhouse: Path) -> tuple[str, list[Path]]:
    """A real package (with its dependencies) from the registry, else a small wheel built here:
    (requirement, wheels)."""
    provided = {canonicalize_name(d.metadata["Name"]) for d in importlib.metadata.distributions()}
    for requirement in CANDIDATES:
        if canonicalize_name(Requirement(requirement).name) in provided:
            continue
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "-q", requirement, "-d", str(wheelhouse)],
                                 capture_output=True, timeout=600, check=False)
        if fetched.returncode == 0:
            return requirement, sorted(wheelhouse.glob("*.whl"))
    return "bench_pkg", [build_wheel(wheelhouse, "bench_pkg", "1.0", "VALUE = 1\n")]


def bench_sluice(calls: int, package: str, wheelhouse: Path, home: Path) -> dict[str, Any]:
    server = EmbeddedRedis(home / "redis").start()
    env = os.environ | {"SLUICE_BROKER_URL": server.url, "SLUICE_HOME": str(home), "SLUICE_REMOTE_SECRET": "bench",
                        "UV_NO_INDEX": "1", "UV_FIND_LINKS": str(wheelhouse), "UV_CACHE_DIR": str(home / "uv"),
                        "PYTHONPATH": str(ROOT)}
    os.environ.update({k: env[k] for k in ("SLUICE_BROKER_URL", "SLUICE_HOME", "SLUICE_REMOTE_SECRET")})
    workers = [start_worker("cpu", "cached", env),
               start_worker("highmem", "fresh", env | {"SLUICE_FRESH_ENV_PER_CALL": "1", "UV_NO_CACHE": "1"})]
    try:
        wait_for_workers(server.client(), ["cached", "fresh"])
        import sluice

        def noop() -> None:
            return None

        from bench.apps import noop as noop_task

        plain = sluice.remote(noop)
        cached = sluice.remote(packages=[package])(noop)
        fresh = sluice.remote(packages=[package], memory="8Gi")(noop)  # 8Gi: the highmem worker
        result = {"delay_get": figures(timed(lambda: noop_task.delay().get(timeout=60), calls)),
                  "no_packages": figures(timed(plain, calls)), "cached_env": figures(timed(cached, calls)),
                  "fresh_install": figures(timed(fresh, max(5, calls // 4)))}
        with sluice.session(packages=[package]) as session:   # one warm sandbox, as Ray reuses its workers
            result["session_cached_env"] = figures(timed(lambda: session.call(noop), calls))
        return result
    finally:
        for worker in workers:
            worker.terminate()
            worker.wait(30)
        server.stop()


def bench_ray(calls: int, wheels: list[Path]) -> dict[str, Any]:
    try:
        import ray
    except ImportError:
        return {"skipped": "ray is not installed (pip install ray)"}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote
        def noop() -> None:
            return None

        with_pip = noop.options(runtime_env={"pip": [str(w) for w in wheels]})
        try:
            pip_figures: dict[str, Any] = figures(timed(lambda: ray.get(with_pip.remote(), timeout=600), calls))
        except Exception as exc:  # noqa: BLE001 - report why Ray's pip env failed instead of no figure
            pip_figures = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        return {"no_packages": figures(timed(lambda: ray.get(noop.remote()), calls)), "pip_runtime_env": pip_figures,
                "version": ray.__version__}
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40, help="timed calls per case (fresh install: a quarter)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-remote-") as tmp:
        wheelhouse = Path(tmp) / "wheels"
        wheelhouse.mkdir()
        package, wheels = fill_wheelhouse(wheelhouse)
        sluice_figures = bench_sluice(args.calls, package, wheelhouse, Path(tmp) / "home")
        ray_figures = bench_ray(args.calls, wheels)
    cached, fresh = sluice_figures["cached_env"]["median_ms"], sluice_figures["fresh_install"]["median_ms"]
    plain, delay_get = sluice_figures["no_packages"]["median_ms"], sluice_figures["delay_get"]["median_ms"]
    over_delay = round(max(plain, cached) / delay_get, 2)
    print(json.dumps({"package": package, "sluice": sluice_figures, "ray": ray_figures,
                      "fresh_over_cached": round(fresh / cached, 1), "remote_over_delay_get": over_delay,
                      "goal_cached_under_100ms": cached < 100, "goal_10x_faster_than_fresh": fresh / cached >= 10,
                      "goal_within_3x_delay_get": over_delay <= 3}))


if __name__ == "__main__":
    main()
