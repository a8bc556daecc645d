"""Remote functions against real workers: the reference's examples, package environments built
with uv from a wheel the tests build, memory growth, kills and the one retry, signatures,
sessions, streaming, and routing by memory, gpu memory and held environments."""

from __future__ import annotations

import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.result import AsyncResult
from celery.utils.nodenames import worker_direct

import sluice
from sluice import App, Settings, headers
from sluice.errors import (
    ConfigurationError,
    InvalidRequestError,
    MemoryExhausted,
    MemoryKilled,
    RemoteError,
    SerializationError,
)
from sluice.signing import seal
from sluice.tasks.heartbeat import read_heartbeat
from sluice.tasks.remote.call import REMOTE_TASK
from sluice.tasks.remote.packages import environment_key
from tests.conftest import ROOT, Workers, wait_for
from tests.wheels import build_wheel

Mi = 1 << 20
CALL_TIMEOUT = 60


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of wheels uv installs from, offline: tiny-pkg, and nothing for 'no-such-pkg'."""
    directory = tmp_path_factory.mktemp("wheels")
    build_wheel(directory, "tiny_pkg", "1.0", "VALUE = 42\n\ndef where():\n    return __file__\n")
    return directory


def offline_uv(wheelhouse: Path, cache: Path) -> dict[str, str]:
    return {"UV_NO_INDEX": "1", "UV_FIND_LINKS": str(wheelhouse), "UV_CACHE_DIR": str(cache)}


@pytest.fixture(scope="module")
def remote_workers(redis_server: Any, wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    """A cpu worker (cached environments) and a highmem worker (a fresh install per call)."""
    client = redis_server.client()
    client.flushdb()
    logs = tmp_path_factory.mktemp("remote-logs")
    pool = Workers(client, logs)
    uv = offline_uv(wheelhouse, tmp_path_factory.mktemp("uv-cache"))
    pool.start("tests.apps.remote_app", "cpu", "rcpu", env=uv | {"SLUICE_ENV_DIR": str(logs / "envs-cpu")})
    pool.start("tests.apps.remote_app", "highmem", "rhigh",
               env=uv | {"SLUICE_ENV_DIR": str(logs / "envs-high"), "SLUICE_FRESH_ENV_PER_CALL": "1"})
    yield pool
    pool.stop_all()


# ---- the reference's examples -----------------------------------------------------------------

def test_reference_packages_example_ignores_what_the_base_image_provides(remote_workers: Workers) -> None:
    import numpy

    @sluice.remote(packages=["requests", "numpy==1.26.0"])
    def fetch(url: str) -> tuple[str, str]:
        import numpy
        import requests
        return url, f"{requests.__name__} {numpy.__version__}"

    call = fetch.spawn("http://example.invalid")
    assert call.get(timeout=CALL_TIMEOUT) == ("http://example.invalid", f"requests {numpy.__version__}")
    assert f"ignored numpy==1.26.0: already provided by the base image (version {numpy.__version__})" in call.output
    assert any(line.startswith("ignored requests: already provided by the base image (version ") for line in call.output)
    assert not any(line.startswith("installing") for line in call.output)


def test_reference_budget_example_runs_and_bad_ceiling_fails_at_decoration(remote_workers: Workers) -> None:
    @sluice.remote(memory="2Gi", max_memory="8Gi")
    def crunch(rows: list[int]) -> int:
        return sum(rows)

    call = crunch.spawn([1, 2, 3])
    assert call.get(timeout=CALL_TIMEOUT) == 6
    assert call.worker == "rcpu@test"        # 2Gi fits the cpu class's 2Gi slot
    assert call.limits[0] < 2 << 30          # capped by what the slot has left beside the pool process
    with pytest.raises(ConfigurationError, match="max_memory=2Gi is below memory=8Gi"):
        @sluice.remote(memory="8Gi", max_memory="2Gi")
        def too_small(rows: list[int]) -> None: ...


def test_calls_spawn_map_and_remote_exceptions(remote_workers: Workers) -> None:
    @sluice.remote
    def square(x: int) -> int:
        print(f"squaring {x}")
        return x * x

    assert square(7) == 49
    handle = square.delay(3)
    assert handle.get(timeout=CALL_TIMEOUT) == 9 and handle.output == ["squaring 3"]
    assert square.map(range(6), timeout=CALL_TIMEOUT) == [0, 1, 4, 9, 16, 25]

    @sluice.remote
    def fails(x: int) -> None:
        raise KeyError(f"no row {x}")

    with pytest.raises(KeyError, match="no row 5") as err:
        fails(5)
    notes = "\n".join(getattr(err.value, "__notes__", []))
    assert "remote traceback (worker rcpu@test)" in notes and 'raise KeyError(f"no row {x}")' in notes


def test_an_exception_that_cannot_be_rebuilt_here_arrives_as_remote_error(remote_workers: Workers) -> None:
    @sluice.remote
    def raises_unpicklable() -> None:
        import threading

        class Odd(Exception):
            def __init__(self) -> None:
                super().__init__("odd failure")
                self.lock = threading.Lock()
        raise Odd()

    with pytest.raises(RemoteError, match=r"Odd: odd failure[\s\S]*remote traceback"):
        raises_unpicklable()


def test_functions_from_local_modules_go_by_reference_and_need_the_module_there(remote_workers: Workers,
                                                                               tmp_path: Path) -> None:
    """As documented: a function from an importable module travels by name, so a worker without
    that module fails with an import error; the worker also notes what the function imports."""
    (tmp_path / "my_local_pkg.py").write_text("def double(x):\n    import not_on_any_worker\n    return 2 * x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import my_local_pkg
        by_reference = sluice.remote(my_local_pkg.double)
        with pytest.raises(ModuleNotFoundError, match="my_local_pkg"):
            by_reference(2)

        @sluice.remote
        def by_value(x: int) -> int:
            import not_on_any_worker  # noqa: F401
            return x

        call = by_value.spawn(1)
        with pytest.raises(ModuleNotFoundError, match="not_on_any_worker"):
            call.get(timeout=CALL_TIMEOUT)
        assert ("sluice: the function imports not_on_any_worker, which this worker does not have; "
                "list it in packages=") in call.output
    finally:
        sys.path.remove(str(tmp_path))


def test_live_resources_fail_before_anything_is_sent(remote_workers: Workers, tmp_path: Path) -> None:
    client = remote_workers.client
    before = client.llen("cpu")
    with open(tmp_path / "x", "w") as handle:
        @sluice.remote
        def write(f: Any) -> None: ...

        with pytest.raises(SerializationError, match="argument 1: cannot send <_io.TextIOWrapper"):
            write(handle)
    assert client.llen("cpu") == before


def test_a_call_times_out_on_the_client_without_losing_the_call(remote_workers: Workers) -> None:
    @sluice.remote
    def slow() -> str:
        import time
        time.sleep(1.5)
        return "done"

    call = slow.spawn()
    with pytest.raises(TimeoutError, match="did not finish within 0.2s"):
        call.get(timeout=0.2)
    assert call.get(timeout=CALL_TIMEOUT) == "done"


# ---- packages ---------------------------------------------------------------------------------

def test_a_local_wheel_is_installed_once_then_served_from_the_cache(remote_workers: Workers) -> None:
    @sluice.remote(packages=["tiny_pkg==1.0"])
    def use_tiny() -> tuple[int, str]:
        import tiny_pkg
        return tiny_pkg.VALUE, tiny_pkg.where()

    first = use_tiny.spawn()
    value, where = first.get(timeout=CALL_TIMEOUT)
    assert value == 42 and "envs-" in where      # imported from the environment, not the base image
    assert any(line.startswith("installing tiny_pkg==1.0") for line in first.output)
    second = use_tiny.spawn()
    assert second.get(timeout=CALL_TIMEOUT)[0] == 42
    assert not any(line.startswith("installing") for line in second.output)
    assert any(line.startswith("using cached environment") for line in second.output)


def test_fresh_env_per_call_installs_every_time(remote_workers: Workers) -> None:
    @sluice.remote(packages=["tiny-pkg"], memory="8Gi")   # 8Gi routes to highmem, set to install per call
    def use_tiny() -> str:
        import tiny_pkg
        return tiny_pkg.where()

    paths = []
    for _ in range(2):
        call = use_tiny.spawn()
        paths.append(call.get(timeout=CALL_TIMEOUT))
        assert call.worker == "rhigh@test"
        assert any(line.startswith("installing tiny-pkg") for line in call.output)
    assert paths[0] != paths[1] and not any(Path(p).exists() for p in paths)   # removed after each call


def test_an_install_failure_raises_invalid_request_with_the_installer_output(remote_workers: Workers) -> None:
    @sluice.remote(packages=["no-such-pkg==9.9"])
    def needs_missing() -> None: ...

    with pytest.raises(InvalidRequestError) as err:
        needs_missing.spawn().get(timeout=CALL_TIMEOUT)
    message = str(err.value)
    assert "installing no-such-pkg==9.9 failed (uv exit" in message
    assert "no-such-pkg" in message.split("failed", 1)[1]   # uv's own explanation follows


def test_the_worker_holding_an_environment_is_preferred(remote_workers: Workers, wheelhouse: Path,
                                                        tmp_path: Path) -> None:
    """A second cpu worker with its own (empty) environment directory: once rcpu holds tiny-pkg's
    environment and says so in its heartbeat, every call with that package list goes to rcpu."""
    @sluice.remote(packages=["tiny_pkg==1.0"])
    def use_tiny() -> int:
        import tiny_pkg
        return tiny_pkg.VALUE

    assert use_tiny.spawn().get(timeout=CALL_TIMEOUT) == 42   # rcpu is the only cpu worker yet
    remote_workers.start("tests.apps.remote_app", "cpu", "rcpu2",
                         env=offline_uv(wheelhouse, tmp_path / "uv") | {"SLUICE_ENV_DIR": str(tmp_path / "envs")})
    key = environment_key(("tiny_pkg==1.0",))
    wait_for(lambda: key in remote_workers.heartbeat("rcpu").get("envs", []), 30, "rcpu to advertise the environment")
    assert key not in remote_workers.heartbeat("rcpu2").get("envs", [])
    calls = [use_tiny.spawn() for _ in range(6)]
    assert [c.get(timeout=CALL_TIMEOUT) for c in calls] == [42] * 6
    assert {c.worker for c in calls} == {"rcpu@test"}


def test_a_call_waiting_in_a_dead_workers_own_queue_goes_home(remote_workers: Workers, tmp_path: Path) -> None:
    """A client picked a worker (it held the environment) that died before taking the call: the
    orphan sweep moves the call to its class queue once the worker's heartbeat is gone."""
    ghost = remote_workers.start("tests.apps.remote_app", "cpu", "ghost", env={"SLUICE_HEARTBEAT_INTERVAL": "0.5"})
    os.killpg(ghost.pid, signal.SIGKILL)
    ghost.wait(10)
    wait_for(lambda: not remote_workers.client.exists("sluice:worker:ghost@test"), 30, "ghost's heartbeat to expire")
    fields = _fields(pickle.dumps((abs, (-5,), {})))
    message = seal(App.default().settings.signing_secret(), fields)
    result = App.default().send_task(REMOTE_TASK, args=[message], queue=worker_direct("ghost@test"),
                                     headers={headers.COMPUTE: {"memory": 2 << 30}, headers.STICKY: "cpu"})
    reply = result.get(timeout=CALL_TIMEOUT)
    live_cpu = {f"{name}@test" for name in ("rcpu", "rcpu2") if "cpu" in _classes(remote_workers, name)}
    assert reply["worker"] in live_cpu, (reply["worker"], live_cpu)   # a live worker of its home class ran it
    logs = "".join(path.read_text(errors="replace") for path in remote_workers.log_dir.glob("*.log"))
    assert "moved 1 message(s) from dead workers' own queues to their home queues" in logs


def _classes(pool: Workers, name: str) -> tuple[str, ...]:
    """The classes a live worker's heartbeat names (none when it has no heartbeat)."""
    beat = read_heartbeat(pool.client, f"{name}@test")
    return beat.classes if beat else ()


# ---- memory -----------------------------------------------------------------------------------

def grow(megabytes: int) -> int:
    """Allocate steadily, 4 MiB at a time, and touch every page."""
    import time
    blocks = []
    for _ in range(megabytes // 4):
        blocks.append(bytearray(b"\x01" * (4 << 20)))
        time.sleep(0.01)
    return len(blocks) * 4


def test_early_growth_raises_the_limit_instead_of_killing(remote_workers: Workers) -> None:
    grower = sluice.remote(memory="64Mi", max_memory="512Mi")(grow)
    call = grower.spawn(200)
    assert call.get(timeout=CALL_TIMEOUT) == 200
    assert call.limits[:3] == [64 * Mi, 128 * Mi, 256 * Mi]   # doubled at 90%, never killed
    assert call.attempt == 1
    assert any("passed 90% of the 64Mi limit; limit raised to 128Mi" in line for line in call.output)


def test_past_max_memory_the_call_is_killed_retried_once_then_fails(remote_workers: Workers) -> None:
    grower = sluice.remote(memory="64Mi", max_memory="128Mi")(grow)
    with pytest.raises(MemoryExhausted) as err:
        grower.spawn(400).get(timeout=CALL_TIMEOUT)
    message = str(err.value)
    assert "ended without a complete response twice" in message
    assert "killed for memory" in message and "over its limit of 128Mi" in message
    assert "retrying once (attempt 2 of 2) in a fresh sandbox at 128Mi" in message


def test_a_retry_that_needs_a_bigger_class_is_escalated_there(remote_workers: Workers, tmp_path: Path) -> None:
    """(Its own two workers beside the module's, on the same Redis, which it does not flush.)"""
    from tests.apps.remote_ladder import app as ladder

    workers = Workers(remote_workers.client, tmp_path)
    try:
        workers.start("tests.apps.remote_ladder", "rsmall", "rsmall")
        workers.start("tests.apps.remote_ladder", "rbig", "rbig")
        grower = sluice.remote(memory="96Mi", max_memory="700Mi", app=ladder)(grow)
        call = grower.spawn(360)
        assert call.get(timeout=CALL_TIMEOUT) == 360
        assert call.worker == "rbig@test" and call.attempt == 2
        assert call.output[0].startswith("sluice: retry (attempt 2 of 2) in a fresh sandbox: the previous attempt's "
                                         "sandbox killed for memory")
        assert AsyncResult(call.id, app=ladder).state == "SUCCESS"
        assert "retrying once at" in workers.log("rsmall") and "on rbig (attempt 2 of 2)" in workers.log("rsmall")
    finally:
        workers.stop_all()


# ---- security ---------------------------------------------------------------------------------

class LeavesATrace:
    """Unpickling this creates a file: proof that a payload was (or was not) unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))


def _send_raw(message: dict[str, Any], queue: str = "cpu") -> AsyncResult:
    app = App.default()
    return app.send_task(REMOTE_TASK, args=[message], queue=queue, headers={headers.COMPUTE: {"memory": 2 << 30}})


def _fields(payload: bytes, **changes: Any) -> dict[str, Any]:
    fn = sluice.remote(print)
    return fn.fields(payload, 64 * Mi, stream=False) | changes


def test_tampered_or_unsigned_payloads_are_refused_without_unpickling(remote_workers: Workers, tmp_path: Path) -> None:
    secret = App.default().settings.signing_secret()
    honest = pickle.dumps((print, (LeavesATrace(tmp_path / "honest"),), {}))
    evil = pickle.dumps((print, (LeavesATrace(tmp_path / "evil"),), {}))
    signed = seal(secret, _fields(honest))
    tampered = {**signed, "payload": _fields(evil)["payload"]}
    unsigned = {k: v for k, v in seal(secret, _fields(evil)).items() if k != "sig"}
    other_secret = seal("not-the-shared-secret", _fields(evil))
    for message, reason in ((tampered, "signature does not match"), (unsigned, "not signed"),
                            (other_secret, "signature does not match")):
        with pytest.raises(InvalidRequestError, match=reason):
            _send_raw(message).get(timeout=CALL_TIMEOUT)
    assert not (tmp_path / "evil").exists()
    _send_raw(signed).get(timeout=CALL_TIMEOUT)          # the control: a signed payload is unpickled
    assert (tmp_path / "honest").exists()


def test_python_version_mismatch_is_a_clear_error(remote_workers: Workers, tmp_path: Path) -> None:
    secret = App.default().settings.signing_secret()
    message = seal(secret, _fields(pickle.dumps((print, (LeavesATrace(tmp_path / "trace"),), {})), python="3.99"))
    ours = f"{sys.version_info.major}.{sys.version_info.minor}"
    with pytest.raises(InvalidRequestError, match=f"client runs Python 3.99 and this worker runs Python {ours}"):
        _send_raw(message).get(timeout=CALL_TIMEOUT)
    assert not (tmp_path / "trace").exists()


def test_queues_not_configured_for_remote_calls_refuse_them(remote_workers: Workers, tmp_path: Path) -> None:
    remote_workers.start("tests.apps.remote_app", "reports", "rreports", plain_celery=True)  # a non-class queue
    secret = App.default().settings.signing_secret()
    message = seal(secret, _fields(pickle.dumps((print, (LeavesATrace(tmp_path / "trace"),), {}))))
    with pytest.raises(InvalidRequestError, match=r"on queue 'reports': it does not take remote calls"):
        _send_raw(message, queue="reports").get(timeout=CALL_TIMEOUT)
    assert not (tmp_path / "trace").exists()
    only_highmem = App("tests.remote_classes", settings=Settings.load(env=os.environ | {"SLUICE_REMOTE_CLASSES": "highmem"}))
    call = sluice.remote(memory="64Mi", app=only_highmem)(lambda: "ok").spawn()
    assert call.get(timeout=CALL_TIMEOUT) == "ok" and call.worker == "rhigh@test"  # not the smaller cpu class


# ---- sandboxes forked from a warm template ----------------------------------------------------

def test_each_call_is_a_fresh_process_forked_from_a_warm_template_that_is_replaced_if_killed(
        remote_workers: Workers) -> None:
    """Every plain call runs in a new process (a new pid; a module attribute one call sets is not
    there in the next), forked from a template process that stays (sandboxes share parents, one
    per pool process at most, and each parent is a template of this worker, not a pool process).
    SIGKILLed templates are replaced on the next call, which still answers; a template whose pool
    process is SIGKILLed dies with it."""
    import psutil

    @sluice.remote
    def where() -> tuple[int, int, bool]:
        import json
        import os
        marked = hasattr(json, "sluice_marked")
        json.sluice_marked = True  # type: ignore[attr-defined]
        return os.getpid(), os.getppid(), marked

    first = [where() for _ in range(8)]
    assert len({pid for pid, _, _ in first}) == 8 and not any(marked for _, _, marked in first)
    templates = {psutil.Process(parent) for _, parent, _ in first}
    pool_processes = [child for worker in remote_workers.processes if worker.poll() is None
                      for child in psutil.Process(worker.pid).children()]
    assert 1 <= len(templates) <= len(pool_processes)
    assert all("sandbox_main.py" in " ".join(t.cmdline()) and t.parent() in pool_processes for t in templates)
    for template in templates:
        template.kill()  # zombies until their pool process's next call reaps and replaces them
    again = [where() for _ in range(4)]
    assert not any(marked for _, _, marked in again)
    assert not {parent for _, parent, _ in again} & {t.pid for t in templates}, "new templates answered"
    template = psutil.Process(again[-1][1])
    pool_process = template.parent()
    assert pool_process is not None
    pool_process.kill()
    gone, alive = psutil.wait_procs([template], timeout=10)
    assert gone and not alive, "a template outlived its pool process"


# ---- sessions ---------------------------------------------------------------------------------

def test_a_session_keeps_state_between_calls(remote_workers: Workers) -> None:
    @sluice.remote
    def count() -> int:
        global calls_seen
        calls_seen = globals().get("calls_seen", 0) + 1
        return calls_seen

    @sluice.remote
    def pid() -> int:
        import os
        return os.getpid()

    assert count() == 1 and count() == 1          # each plain call has a fresh sandbox
    with sluice.session(memory="256Mi") as s:
        assert [count(), count(), count()] == [1, 2, 3]
        assert len({pid(), pid(), s.call(os.getpid)}) == 1
    with sluice.session(memory="256Mi") as s:
        assert count() == 1                       # a new session, a new sandbox
        with pytest.raises(ConfigurationError, match=r"needs \['tiny_pkg'\], which this session was not opened with"):
            s.call(sluice.remote(packages=["tiny_pkg"])(lambda: 1))


def test_a_session_call_killed_for_memory_is_not_retried(remote_workers: Workers) -> None:
    with sluice.session(memory="64Mi", max_memory="128Mi") as s:
        assert s.call(lambda: "warm") == "warm"
        with pytest.raises(MemoryKilled, match="calls in a session are never retried"):
            s.call(grow, 400)


def test_a_session_ends_when_its_client_disappears(remote_workers: Workers) -> None:
    script = ("import sluice, sys, time\n"
              "with sluice.session(memory='128Mi', lease=2.0) as s:\n"
              "    assert s.call(abs, -1) == 1\n"
              "    print(s.handle.id, flush=True)\n"
              "    time.sleep(600)\n")
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert client.stdout is not None
    ready, _, _ = select.select([client.stdout], [], [], 60)   # bounded: readline() alone could hang
    session_task = client.stdout.readline().strip() if ready else ""
    assert session_task, "the client did not open its session"
    os.kill(client.pid, signal.SIGKILL)
    client.wait(10)
    ended = AsyncResult(session_task, app=App.default()).get(timeout=30)
    assert ended["ended"] == "lease expired (the client went away)" and ended["calls"] == 1


# ---- streaming and gpu ------------------------------------------------------------------------

def test_stream_logs_prints_output_while_the_call_runs(remote_workers: Workers, tmp_path: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    streaming = App("tests.streaming", settings=Settings.load(env=os.environ | {"SLUICE_STREAM_LOGS": "1"}))
    flag = tmp_path / "go"

    @sluice.remote(app=streaming)
    def waits(path: str) -> str:
        import os
        import time
        print("waiting for the flag", flush=True)
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        return "saw it"

    call = waits.spawn(str(flag))
    result: list[str] = []
    waiter = threading.Thread(target=lambda: result.append(call.get(timeout=CALL_TIMEOUT)))
    waiter.start()
    seen = ""

    def streamed() -> bool:
        nonlocal seen
        seen += capfd.readouterr().err
        return "waiting for the flag" in seen

    wait_for(streamed, 30, "the function's output to reach the caller before it returns")
    assert not result                               # still running: the line was streamed, not returned
    flag.touch()
    waiter.join(CALL_TIMEOUT)
    assert result == ["saw it"]


def test_gpu_memory_chooses_a_worker_with_enough(remote_workers: Workers) -> None:
    remote_workers.start("tests.apps.remote_app", "gpu", "rgpu", env={"SLUICE_GPU_COUNT": "1", "SLUICE_GPU_MEMORY": "16Gi"})
    wait_for(lambda: remote_workers.heartbeat("rgpu").get("gpu_memory") == 16 << 30, 30, "the gpu heartbeat")

    @sluice.remote(gpu_memory="8Gi")
    def on_gpu() -> str:
        return "trained"

    call = on_gpu.spawn()
    assert call.get(timeout=CALL_TIMEOUT) == "trained" and call.worker == "rgpu@test"
    with pytest.raises(InvalidRequestError, match=r"reserves 32Gi of GPU memory and this worker's GPU has 16Gi"):
        sluice.remote(gpu_memory="32Gi")(lambda: None).spawn().get(timeout=CALL_TIMEOUT)


def test_a_worker_without_the_secret_says_it_takes_no_calls_and_refuses_one_sent_to_it(
        remote_workers: Workers, tmp_path: Path) -> None:
    """A cpu worker started without the signing secret advertises remote: false (rcpu, with it,
    true: routing reads this) and refuses a signed call put on its own queue without unpickling
    it; the control: the same call on rcpu's own queue is unpickled and run."""
    remote_workers.start("tests.apps.remote_app", "cpu", "rnosecret", env={"SLUICE_REMOTE_SECRET": ""})
    assert remote_workers.heartbeat("rcpu")["remote"] is True
    assert remote_workers.heartbeat("rnosecret")["remote"] is False
    call = seal(App.default().settings.signing_secret(),
                _fields(pickle.dumps((print, (LeavesATrace(tmp_path / "trace"),), {}))))
    with pytest.raises(InvalidRequestError, match="refusing remote call: this process has no"):
        _send_raw(call, worker_direct("rnosecret@test")).get(timeout=CALL_TIMEOUT)
    assert not (tmp_path / "trace").exists()
    _send_raw(call, worker_direct("rcpu@test")).get(timeout=CALL_TIMEOUT)
    assert (tmp_path / "trace").exists()

