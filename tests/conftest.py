"""Fixtures: a real redis-server on a free loopback port and real worker subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import redis

from sluice import App, keys
from sluice.deploy.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parent.parent

# Property tests are bounded by their number of examples (100 unless a test says otherwise), never
# by hypothesis's 200 ms deadline per example: the time one takes on a loaded machine decides nothing.
hypothesis.settings.register_profile("sluice", deadline=None)
hypothesis.settings.load_profile("sluice")

#: Fixtures that start a redis-server (and, through it, workers): a test using one is integration.
_REAL_SERVER_FIXTURES = {"redis_server"}


#: Set in a pytest-xdist worker process (``-n``): its share of the tests is known only as it runs them.
_XDIST_WORKER = "PYTEST_XDIST_WORKER" in os.environ

#: Scenarios started at collection time, by test node id (see ``starts_early``).
_EARLY = pytest.StashKey[dict[str, subprocess.Popen[bytes]]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that needs the real redis-server as integration (the fixture closure
    includes redis_client, workers and basic_app), so ``-m "not integration"`` is the fast loop.

    A test marked ``starts_early(start)`` checks a scenario too long to wait for in line: once
    the selection is final (``-m``/``-k`` applied), ``start(directory)`` launches it in the
    background, and the test moves to the end of the run, where its ``early`` fixture hands it
    the scenario's process to wait for. Under pytest-xdist it goes first instead, and waits for
    its scenario in line while the other workers run the rest."""
    for item in items:
        if _REAL_SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    early = [item for item in items if item.get_closest_marker("starts_early")]
    if _XDIST_WORKER:
        # pytest-xdist hands each worker a whole file at a time, in this order: the long waits
        # first (the early scenarios, then the files that start Redis and workers), so the last
        # files handed out are the quick ones and the workers end together.
        items.sort(key=lambda item: (item not in early, not item.get_closest_marker("integration")))
    else:
        items[:] = [item for item in items if item not in early] + early


def pytest_collection_finish(session: pytest.Session) -> None:
    started = session.config.stash.setdefault(_EARLY, {})
    for item in session.items:
        marker = item.get_closest_marker("starts_early")
        if marker is not None and not session.config.option.collectonly and not _XDIST_WORKER:
            started[item.nodeid] = marker.args[0](Path(tempfile.mkdtemp(prefix="sluice-early-")))


def pytest_unconfigure(config: pytest.Config) -> None:
    for process in config.stash.get(_EARLY, {}).values():
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture
def early(request: pytest.FixtureRequest) -> subprocess.Popen[bytes]:
    """The background scenario of a ``starts_early`` test, started when the suite was collected
    (or now, in a pytest-xdist worker, which cannot know at collection which tests it will run)."""
    started = request.config.stash.setdefault(_EARLY, {})
    if request.node.nodeid not in started:
        start = request.node.get_closest_marker("starts_early").args[0]
        started[request.node.nodeid] = start(Path(tempfile.mkdtemp(prefix="sluice-early-")))
    return started[request.node.nodeid]


#: The variables the session's Redis sets for the tests that use it (and their workers), and only
#: for them: a test without it sees none of them, whichever test ran before.
SERVER_ENV = ("SLUICE_BROKER_URL", "SLUICE_HOME", "SLUICE_REMOTE_SECRET")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """One redis-server for the session; SLUICE_BROKER_URL points every app and worker at it (and
    one remote-call signing secret is shared by the tests and their workers). The variables are
    restored when the session ends."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis")).start()
    values = (server.url, str(tmp_path_factory.mktemp("sluice-home")), "sluice-tests-signing-secret")
    with pytest.MonkeyPatch.context() as env:
        for name, value in zip(SERVER_ENV, values):
            env.setenv(name, value)
        yield server
    server.stop()


@pytest.fixture(autouse=True)
def _server_env_only_where_used(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                                tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A test that does not use the session's Redis runs without its variables (and with a
    SLUICE_HOME of its own, never the user's), so its outcome does not depend on whether an
    integration test ran before it; the process's default App (made once, from the environment
    of its first use) is made again on each side of it, so none leaks across. A test app module
    (``tests.apps.*``, whose App reads the environment once, at import) that it imported first is
    forgotten after it: a later test that imports it gets one on its own environment (Celery
    then warns that the module's task names were registered before, by the first import; this
    process only sends those tasks, workers run them)."""
    if "redis_server" in request.fixturenames:
        yield
        return
    for name in SERVER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path_factory.mktemp("home")))
    App.default.cache_clear()
    imported = set(sys.modules)
    yield
    App.default.cache_clear()
    for name in set(sys.modules) - imported:
        if name.startswith("tests.apps."):
            del sys.modules[name]


@pytest.fixture
def redis_client(redis_server: EmbeddedRedis) -> redis.Redis:
    """A client on a freshly flushed database: no queue or key leaks between tests."""
    client = redis_server.client()
    client.flushdb()
    return client


def seeded_random(what: str) -> tuple[random.Random, int]:
    """A random source for a test's choices (kill instants, say) and its seed: TEST_SEED from the
    environment, else a fixed one, so a run is replayed by its printed seed and CI runs the same
    choices every time."""
    seed = int(os.environ.get("TEST_SEED", "20261207"))
    print(f"{what}: seeded with TEST_SEED={seed}")
    return random.Random(seed), seed


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.1) -> object:
    """Poll until ``predicate()`` is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


class Workers:
    """Starts real worker processes (``sluice worker`` or plain ``celery worker``) and stops them."""

    def __init__(self, client: redis.Redis, log_dir: Path) -> None:
        self.client = client
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, app: str, queue: str | None, name: str, *extra: str, plain_celery: bool = False,
              env: dict[str, str] | None = None, wait: bool = True, hostname: str | None = None
              ) -> subprocess.Popen[bytes]:
        if plain_celery:  # no queue: as Celery's worker starts without -Q
            args = ["-m", "celery", "-A", app, "worker", *(["-Q", queue] if queue else [])]
        else:
            args = ["-m", "sluice", "worker", "-A", app, *(["--queue", queue] if queue else [])]
        hostname = hostname or f"{name}@test"
        log = open(self.log_dir / f"{name}.log", "ab")
        process = subprocess.Popen(
            [sys.executable, *args, "-n", hostname, "--loglevel", "INFO", *extra],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env=os.environ | {"PYTHONPATH": str(ROOT)} | (env or {}))
        log.close()
        self.processes.append(process)
        if wait:
            wait_for(lambda: process.poll() is not None or self.client.exists(keys.worker_heartbeat(hostname)),
                     60, f"worker {hostname} to start")
            assert process.poll() is None, f"worker {hostname} exited: {self.log(name)}"
        return process

    def heartbeat(self, name: str) -> dict[str, object]:
        body = self.client.get(keys.worker_heartbeat(f"{name}@test"))
        assert body is not None, f"no heartbeat for {name}"
        return json.loads(body)

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        """SIGKILL of each worker's process group: a test that is about shutdown signals its
        worker itself, and a warm one takes ~1.7 s here (billiard's pool join). With
        TEST_GRACEFUL_TEARDOWN=1 (a coverage run: a killed process writes no data) a SIGTERM
        to the main process instead, a warm shutdown, SIGKILL after 20 s."""
        graceful = os.environ.get("TEST_GRACEFUL_TEARDOWN") == "1"
        for process in self.processes:
            if process.poll() is None:
                if graceful:
                    process.send_signal(signal.SIGTERM)
                else:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


@pytest.fixture
def workers(redis_client: redis.Redis, tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(redis_client, tmp_path)
    yield pool
    pool.stop_all()


@pytest.fixture
def basic_app(redis_server: EmbeddedRedis):  # noqa: ANN201 - a module
    """tests.apps.basic, imported only once SLUICE_BROKER_URL points at the test server."""
    import importlib

    return importlib.import_module("tests.apps.basic")


def consuming_channel(connection: Any, queue: str, messages: int, no_ack: bool = False) -> Any:
    """``connection``'s channel consuming ``queue`` (as a worker's does; with ``no_ack`` as a
    control client reads its replies), with ``messages`` JSON messages published to it; fetch
    them with :func:`fetch_by_hand`."""
    from kombu import Producer, Queue

    from sluice.queues.broker import scripts

    channel = connection.default_channel
    scripts.load(channel.client, "fetch")  # as the channel does on a fresh Redis
    producer = Producer(channel)
    for n in range(messages):
        producer.publish({"n": n}, routing_key=queue, declare=[Queue(queue)], serializer="json")
    channel.basic_consume(queue, no_ack, lambda *_: None, f"{queue}-consumer")
    return channel


def fetch_by_hand(channel: Any, queue: str) -> str:
    """Take the next message of ``queue`` with the channel's fetch script, recorded as held on
    the channel as its delivery records it, read here instead of by the channel's reply
    handler (which would hand it to a consumer); its delivery tag."""
    _, _, _, raw, _ = channel.client.execute_command(*channel._fetch_command([queue]))
    del channel.pending_acks[: channel._acks_in_flight]  # that fetch carried them into Redis
    channel._acks_in_flight = 0
    tag = raw.decode()
    channel.fetched.add(tag)
    channel.qos.append(None, tag)
    return tag

