"""Run Celery's own integration suite against sluice and print one JSON line.

Celery's maintainers test Celery's behaviour with ``t/integration`` (canvas, chords, retries,
revokes, states, result backends, inspect) against a real broker and a real worker. sluice
replaces kombu's Redis transport, Celery's router, task class, request and Redis result backend,
so that suite is the best check that it keeps Celery's behaviour. This runner takes the suite
from the sdist of the Celery version installed (pinned by that version; ``pip download``, so it
needs only the package index), and runs it up to three ways, each on a real ``redis-server`` of its own:

* ``celery``: stock Celery with kombu's Redis transport (the baseline);
* ``transport``: a stock Celery app with sluice's transport (``broker_transport``);
* ``sluice``: a sluice App (:mod:`tests.compat.sluice_app`) with its worker.

It prints one JSON line: passed, failed and skipped per way, the tests that pass on the baseline
and fail on another way, and those of them (or, without the baseline, any failure on sluice)
that are not known differences (``KNOWN``, each documented in the README's "Differences from
Celery"); it exits 1 when there is such an undocumented difference.

    python -m tests.compat.celery_suite                      # all three ways, the whole suite (~35 min)
    python -m tests.compat.celery_suite --ways sluice --subset ci   # what CI runs (a few minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import celery
import redis

from sluice.deploy.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
WAYS = ("celery", "transport", "sluice")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sluice" / "celery-suite"

#: Which tests: all, or what CI runs against a sluice App (``ci_subset.txt``: tasks, retries,
#: revokes, states, inspect, link errors, and the quick chains, groups and chords; a few minutes).
SUBSETS: dict[str, list[str]] = {
    "all": ["t/integration"],
    "ci": [
        line
        for line in (Path(__file__).with_name("ci_subset.txt")).read_text().splitlines()
        if line and not line.startswith("#")
    ],
}

#: The README's bullets ("Differences from Celery") that explain the known differences, by their lead.
LATE_ACKS = "**`inspect reserved` is empty, `inspect active` says `acknowledged: False`.**"
CLASSES = "**Routing keys and queues are classes.**"
ONCE = "**A task id that already finished runs no more.**"
STARTED = "**STARTED is stored**"
WAIT = "**`.delay()` does not subscribe to the result's channel**"
#: Tests of the suite that fail on a sluice App on purpose, each with the README bullet that says why.
KNOWN: dict[str, str] = {
    "t/integration/test_inspect.py::test_Inspect::test_active": LATE_ACKS,
    "t/integration/test_inspect.py::test_Inspect::test_query_task": LATE_ACKS,
    "t/integration/test_inspect.py::test_Inspect::test_scheduled": CLASSES,
    "t/integration/test_inspect.py::test_Inspect::test_active_queues": CLASSES,
    "t/integration/test_canvas.py::test_chord::test_reapplying_frozen_chord_dispatches_body_again": ONCE,
    # these two pass or fail by timing: whether their poll sees STARTED before RETRY
    "t/integration/test_tasks.py::test_tasks::test_retry": STARTED,
    "t/integration/test_tasks.py::test_tasks::test_retry_with_unpickleable_exception": STARTED,
    "t/integration/test_tasks.py::test_task_redis_result_backend::test_asyncresult_forget_cancels_subscription": WAIT,
    "t/integration/test_tasks.py::test_task_redis_result_backend::test_asyncresult_get_cancels_subscription": WAIT,
}


def suite(version: str, into: Path) -> Path:
    """The sdist of Celery ``version`` (downloaded once into the cache), its ``t/`` extracted
    under ``into``; returns ``into``."""
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"celery-{version}.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"celery=={version}", "--no-binary", ":all:", "--no-deps",
             "--quiet", "-d", str(CACHE)],
            check=True,
        )
    prefix = f"celery-{version}/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix + "t/") and m.isfile()]
        for member in members:
            member.name = member.name[len(prefix):]
            if member.name.count("/") == 1 or member.name.startswith("t/integration/"):
                archive.extract(member, into, filter="data")
    # Celery's own pytest settings (its pyproject.toml): test classes are named test_*
    (into / "pytest.ini").write_text("[pytest]\npython_classes = test_*\nxfail_strict = true\nmarkers =\n    celery\n")
    return into


#: The suite's guard that its tests use only the ``celery`` queue (``ZZZZ_set_app_current``),
#: and what it becomes on a sluice App, whose messaging layer declares its class queues and
#: the intake (``celery``) from the start, and whose in-process session worker adds its own
#: queue (``<node>.dq2``, ``worker_direct``): the guard then allows those, and still fails a
#: test that adds any other queue.
GUARD = "if configured != {'celery'}:"
SLUICE_GUARD = "if {q for q in configured if not q.endswith('.dq2')} - {'celery', *test_app.catalog.names}:"


def prepare(base: Path, way: str, into: Path, url: str) -> dict[str, str]:
    """A copy of the suite for one way under ``into``; returns the environment to run it with."""
    shutil.copytree(base, into)
    address = urlsplit(url)
    env = os.environ | {
        "TEST_BROKER": url,
        "TEST_BACKEND": url,
        "REDIS_HOST": str(address.hostname),
        "REDIS_PORT": str(address.port),
        "PYTHONPATH": os.pathsep.join([str(into), str(ROOT)]),
        # the suite starts ``celery`` itself (a worker, a serialization check): this Python's
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    env.pop("SLUICE_BROKER_URL", None)
    if way == "transport":
        overrides = {"broker_transport": "sluice.queues.broker.transport:Transport"}
        (into / "integration-tests-config.json").write_text(json.dumps(overrides))
    if way == "sluice":
        conftest = into / "t" / "integration" / "conftest.py"
        text = conftest.read_text()
        if text.count(GUARD) != 1:
            raise SystemExit(f"{conftest}: the suite's queue guard changed; expected one {GUARD!r}")
        conftest.write_text(text.replace(GUARD, SLUICE_GUARD))
        env |= {"SLUICE_BROKER_URL": url, "SLUICE_HOME": str(into / "sluice-home")}
    return env


def run_way(way: str, into: Path, env: dict[str, str], targets: list[str], extra: list[str]) -> dict[str, Any]:
    """One run of the suite; its figures and each test's outcome (from pytest's JUnit XML)."""
    report = into / "report.xml"
    # Celery's fixtures (celery_parameters and the rest), registered by pytest-celery in Celery's
    # own test environment
    plugins = ["-p", "celery.contrib.pytest", *(["-p", "tests.compat.sluice_app"] if way == "sluice" else [])]
    # a test module that needs what is not installed here (azure, cryptography) is one failure
    # on every way alike, not the end of the run
    command = [sys.executable, "-m", "pytest", *targets, "-p", "no:cacheprovider", "-q", "--junitxml", str(report),
               "-o", "junit_family=xunit1", "--continue-on-collection-errors", *plugins, *extra]
    started = time.monotonic()
    with open(into / "pytest.log", "w") as log:
        subprocess.run(command, cwd=into, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    seconds = round(time.monotonic() - started)
    outcomes = outcomes_of(report) if report.exists() else {}
    counts = {kind: sum(1 for o in outcomes.values() if o == kind) for kind in ("passed", "failed", "skipped")}
    return {"way": way, **counts, "seconds": seconds, "log": str(into / "pytest.log"), "outcomes": outcomes}


def outcomes_of(report: Path) -> dict[str, str]:
    """Each test case's outcome in a JUnit XML report: passed, failed (a failure or an error)
    or skipped; by pytest's node id (``file::class::name``, ``file::name``)."""
    outcomes: dict[str, str] = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        classname = case.get("classname", "")
        path = case.get("file") or classname.replace(".", "/") + ".py"
        module = path.removesuffix(".py").replace("/", ".")
        owner = classname.removeprefix(module).lstrip(".")  # the test's class; none for a function
        test = "::".join([path, *([owner] if owner else []), case.get("name", "")])
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes[test] = "failed"
        elif case.find("skipped") is not None:
            outcomes[test] = "skipped" if outcomes.get(test) != "passed" else "passed"
        else:
            outcomes[test] = "passed" if outcomes.get(test) != "failed" else "failed"
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)}")
    parser.add_argument("--subset", default="all", choices=sorted(SUBSETS), help="which tests (ci: what CI runs)")
    parser.add_argument("--keep", type=Path, help="run under this directory and keep it (logs, reports)")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    args = parser.parse_args(argv)
    ways = [w for w in args.ways.split(",") if w]
    unknown = sorted(set(ways) - set(WAYS))
    if unknown:
        parser.error(f"unknown way(s) {', '.join(unknown)}; choose from {', '.join(WAYS)}")
    # test paths given after -- replace the subset's
    targets = [a for a in args.pytest_args if a.startswith("t/")] or SUBSETS[args.subset]
    extra = [a for a in args.pytest_args if not a.startswith("t/")]
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="celery-suite-"))
    workdir.mkdir(parents=True, exist_ok=True)
    base = suite(celery.__version__, workdir / "suite")

    def one_way(way: str) -> dict[str, Any]:
        # CI spends no time on the known differences (each would run six times: the suite
        # reruns its flaky-marked tests five times), only on finding a new one
        known = [f"--deselect={test}" for test in KNOWN] if args.subset == "ci" and way == "sluice" else []
        with plain_redis() as url:
            run = run_way(way, workdir / way, prepare(base, way, workdir / way, url), targets, [*extra, *known])
        print(f"{way}: {run['passed']} passed, {run['failed']} failed, {run['skipped']} skipped in "
              f"{run['seconds']} s ({run['log']})", file=sys.stderr)
        return run

    try:
        # the ways at once, each on its own redis-server: the suite waits on its tasks nearly all
        # the time (the CPUs stay 99% idle), so three take the time of one
        with ThreadPoolExecutor(len(ways)) as pool:
            runs = dict(zip(ways, pool.map(one_way, ways)))
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    figures, undocumented = summary(runs)
    tests = args.subset if targets == SUBSETS[args.subset] else targets
    print(json.dumps({"celery_version": celery.__version__, "tests": tests, **figures}))
    return 1 if undocumented else 0


@contextlib.contextmanager
def plain_redis(timeout: float = 10) -> Iterator[str]:
    """A plain redis-server on a free loopback port (no password: the suite's own helpers
    connect without one, to ``REDIS_HOST``:``REDIS_PORT``); yields its URL."""
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
                              stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(10)


def summary(runs: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """The JSON figures, and the undocumented differences among them."""
    baseline = runs.get("celery", {}).get("outcomes")
    figures: dict[str, Any] = {way: {k: run[k] for k in ("passed", "failed", "skipped", "seconds")}
                               for way, run in runs.items()}
    undocumented: list[str] = []
    for way, run in runs.items():
        if way == "celery":
            continue
        failed = sorted(t for t, o in run["outcomes"].items() if o == "failed")
        if baseline is not None:
            failed = [t for t in failed if baseline.get(t) == "passed"]
        figures[way]["differences"] = failed
        if way == "sluice" or baseline is not None:
            new = [t for t in failed if t not in KNOWN]
            figures[way]["undocumented"] = new
            undocumented += new
    return figures, undocumented


if __name__ == "__main__":
    sys.exit(main())
