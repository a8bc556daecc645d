"""Remote functions, client side: every rule of the reference's Packages, Units and Pickling
sections, valid and invalid, checked at decoration time or before anything is sent."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import pickle
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import redis

import sluice
from sluice.client.remote.serialization import dumps, import_hints, pack_call
from sluice.errors import (
    ConfigurationError,
    InvalidPackageError,
    InvalidRequestError,
    SerializationError,
)
from sluice.signing import decode, encode, seal, unseal
from sluice.tasks.remote.call import Call
from sluice.tasks.remote.packages import (
    environment_key,
    normalize_packages,
    plan_install,
)
from sluice.tasks.remote.settings import RemoteSettings
from sluice.workers.remote.package_envs import READY, EnvironmentCache

Gi, Mi = 1 << 30, 1 << 20


# ---- Packages ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("entries", "normalized"), [
    (["requests"], ("requests",)),
    (["numpy==1.26.0"], ("numpy==1.26.0",)),
    (["pandas>=2,<3"], ("pandas>=2,<3",)),
    (["requests[security]>=2.31"], ("requests[security]>=2.31",)),
    (["Requests", "requests"], ("Requests",)),                       # compared as the index compares
    (["scikit_learn", "scikit-learn==1.5"], ("scikit_learn",)),      # the first spelling is kept
    (["Scikit.Learn", "scikit_learn"], ("Scikit.Learn",)),
    (["zlib-ng", "attrs", "Numpy==1.26.0"], ("attrs", "Numpy==1.26.0", "zlib-ng")),  # sorted by name
    (["  requests  "], ("requests",)),
    ([], ()),
    (None, ()),
])
def test_packages_are_normalized(entries: list[str] | None, normalized: tuple[str, ...]) -> None:
    assert normalize_packages(entries) == normalized


@pytest.mark.parametrize("bad", ["", "   ", "numpy==", "==1.0", "a b", "numpy>>1", "requests[", "x @ https://e.org/x.whl",
                                 'numpy; python_version<"3"', 3, None, b"numpy"])
def test_malformed_package_raises_at_decoration_naming_it(bad: object) -> None:
    with pytest.raises(InvalidPackageError) as err:
        @sluice.remote(packages=["requests", bad])  # type: ignore[list-item]
        def fn() -> None: ...
    assert repr(bad) in str(err.value)
    assert "PEP 508" in str(err.value)


def test_a_single_string_is_not_a_package_list() -> None:
    with pytest.raises(InvalidPackageError, match="list of requirements"):
        sluice.remote(packages="numpy")(lambda: None)


@pytest.mark.parametrize(("entries", "provided", "install", "ignored"), [
    (["numpy==2.0"], {"numpy": "2.0.2"}, (), ("ignored numpy==2.0: already provided by the base image (version 2.0.2)",)),
    (["numpy==1.26.0"], {"numpy": "2.4.6"}, (), ("ignored numpy==1.26.0: already provided by the base image (version 2.4.6)",)),
    (["Numpy"], {"numpy": None}, (), ("ignored Numpy: already provided by the base image",)),  # version unknown
    (["requests[socks]"], {"requests": "2.31"}, ("requests[socks]",), ()),                      # extras are kept
    (["tiny-pkg", "numpy"], {"numpy": "2.0"}, ("tiny-pkg",), ("ignored numpy: already provided by the base image (version 2.0)",)),
    (["scikit_learn"], {"scikit-learn": "1.5"}, (), ("ignored scikit_learn: already provided by the base image (version 1.5)",)),
])
def test_worker_leaves_out_what_the_base_image_provides(entries: list[str], provided: dict[str, str | None],
                                                         install: tuple[str, ...], ignored: tuple[str, ...]) -> None:
    plan = plan_install(entries, provided)
    assert (plan.install, plan.ignored) == (install, ignored)


def test_worker_validates_the_list_again() -> None:
    with pytest.raises(InvalidPackageError):
        plan_install(["numpy==", "requests"], {})


def test_environment_key_is_content_addressed() -> None:
    assert environment_key(["b", "a"]) == environment_key(["a", "b"])
    assert environment_key(["a"]) != environment_key(["a==1"])


# ---- Units ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "size"), [
    ("512Mi", 512 * Mi), ("512MiB", 512 * Mi), ("2Gi", 2 * Gi), ("1Ti", 1 << 40), ("64Ki", 64 << 10), ("64KiB", 64 << 10),
    ("2G", 2_000_000_000), ("2GB", 2_000_000_000), ("1K", 1000), ("3M", 3_000_000), ("1T", 10**12),
    (1073741824, Gi), ("1073741824", Gi),
])
def test_sizes_accepted(value: object, size: int) -> None:
    fn = sluice.remote(memory=value)(lambda: None)
    assert fn.budget.memory == size


@pytest.mark.parametrize("bad", ["1.5Gi", "-1Gi", -5, True, False, "", "Gi", "12Qi", "1.0Gi", 1.5, "lots", [1]])
@pytest.mark.parametrize("keyword", ["memory", "max_memory", "gpu_memory", "max_gpu_memory"])
def test_sizes_rejected(keyword: str, bad: object) -> None:
    with pytest.raises(ConfigurationError) as err:
        sluice.remote(**{keyword: bad})(lambda: None)
    assert repr(bad) in str(err.value) and keyword in str(err.value)
    assert "Ki/Mi/Gi/Ti" in str(err.value)


def test_ceiling_below_its_start_is_a_decoration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"max_memory=2Gi is below memory=8Gi"):
        @sluice.remote(memory="8Gi", max_memory="2Gi")
        def crunch(rows: list[int]) -> None: ...
    with pytest.raises(ConfigurationError, match=r"max_gpu_memory=8Gi is below gpu_memory=16Gi"):
        sluice.remote(gpu_memory="16Gi", max_gpu_memory="8Gi")(lambda: None)


def test_reference_budgets_are_accepted() -> None:
    @sluice.remote(memory="2Gi", max_memory="8Gi")
    def crunch(rows: list[int]) -> None: ...

    @sluice.remote(gpu=True, gpu_memory="16Gi")
    def train(data: object) -> None: ...

    assert (crunch.budget.memory, crunch.budget.max_memory) == (2 * Gi, 8 * Gi)
    assert train.budget.gpu and train.budget.gpu_memory == 16 * Gi


def test_gpu_memory_implies_gpu_and_contradiction_is_an_error() -> None:
    assert sluice.remote(gpu_memory="8Gi")(lambda: None).budget.gpu is True
    assert sluice.remote(max_gpu_memory="8Gi")(lambda: None).budget.gpu is True
    with pytest.raises(ConfigurationError, match="gpu_memory implies gpu=True"):
        sluice.remote(gpu=False, gpu_memory="8Gi")(lambda: None)
    with pytest.raises(ConfigurationError, match="must be True or False"):
        sluice.remote(gpu="yes")(lambda: None)  # type: ignore[arg-type]


def _sent_call(redis_client: redis.Redis, queue: str) -> Call:
    """The one remote call waiting in ``queue``, its signature checked as a worker checks it."""
    raw = redis_client.lpop(queue)
    assert raw is not None, f"nothing was sent to {queue}"
    assert redis_client.llen(queue) == 0
    envelope = json.loads(raw)
    args = json.loads(base64.b64decode(envelope["body"]))[0]
    return Call.decode(unseal(sluice.Settings.load().remote_secret, args[0]))


def test_a_call_that_names_no_memory_is_sent_with_the_remote_memory_setting_capped_by_its_ceiling(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """spawn() fills in the operator's remote_memory (here SLUICE_REMOTE_MEMORY=768Mi, not the
    built-in 1Gi) for a function that names no memory, and caps it at the function's max_memory:
    read back from the signed message it published, nothing supplied by the test."""
    monkeypatch.setenv("SLUICE_REMOTE_MEMORY", "768Mi")
    app = sluice.App("tests.remote_rules.default_memory")
    queue = app.catalog.route(sluice.Compute(memory="768Mi"), "a 768Mi call").name

    sluice.remote(app=app)(_unset).spawn()
    assert _sent_call(redis_client, queue).memory == 768 * Mi
    sluice.remote(max_memory="512Mi", app=app)(_unset).spawn()
    assert _sent_call(redis_client, queue).memory == 512 * Mi
    sluice.remote(memory="256Mi", app=app)(_unset).spawn()    # its own memory wins over the setting
    assert _sent_call(redis_client, queue).memory == 256 * Mi
    assert sluice.remote(lambda: None).budget.memory is None  # the decorator itself fixes no default


def test_the_remote_memory_setting_is_1gi_unless_configured() -> None:
    assert sluice.Settings.load(env={"SLUICE_REMOTE_MEMORY": "2Gi"}).section(RemoteSettings).remote_memory == 2 * Gi
    assert sluice.Settings.load(env={}).section(RemoteSettings).remote_memory == Gi


def _unset() -> None:
    """A remote function sent, never run."""


# ---- Pickling ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Point:
    x: int
    y: int


class Local:
    def __init__(self, value: int) -> None:
        self.value = value


def _closure(k: int):  # noqa: ANN202
    return lambda v: v * k


@pytest.mark.parametrize(("what", "value"), [
    ("a lambda", lambda x: x + 1),
    ("a closure over ordinary values", _closure(3)),
    ("a class", Local),
    ("an instance", Local(4)),
    ("a dataclass", Point(1, 2)),
    ("a numpy array", np.arange(10)),
    ("nested containers", {"a": [1, (2, 3)], "b": {4, 5}}),
])
def test_ordinary_objects_serialize(what: str, value: object) -> None:
    restored = cloudpickle.loads(dumps(value))
    if callable(value) and not isinstance(value, type):
        assert restored(2) == value(2)  # type: ignore[operator]
    elif isinstance(value, np.ndarray):
        assert (restored == value).all()
    elif isinstance(value, Local):
        assert restored.value == value.value
    else:
        assert restored == value


def _live_objects(tmp_path: Path) -> list[tuple[str, object, str]]:
    sock = socket.socket()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return [
        ("open file", open(tmp_path / "f.txt", "w"), "an open file"),
        ("binary stream", io.BytesIO(b"x"), "an open file"),
        ("socket", sock, "a socket"),
        ("lock", threading.Lock(), "a lock"),
        ("rlock", threading.RLock(), "a lock"),
        ("event", threading.Event(), "a lock"),
        ("thread", threading.Thread(target=print), "a thread"),
        ("sqlite connection", sqlite3.connect(":memory:"), "a database connection"),
        ("subprocess", proc, "a running subprocess"),
    ]


@pytest.mark.parametrize("index", range(9))
def test_live_resources_raise_serialization_error_naming_the_object(tmp_path: Path, index: int) -> None:
    label, obj, words = _live_objects(tmp_path)[index]

    @sluice.remote
    def use(thing: object) -> None: ...

    with pytest.raises(SerializationError) as err:
        use.spawn(obj)  # raises before any broker is contacted
    assert repr(obj)[:40] in str(err.value), label
    assert words in str(err.value) and "argument 1" in str(err.value)
    assert "create it inside the function" in str(err.value)


def test_a_function_closing_over_a_live_resource_is_named(tmp_path: Path) -> None:
    handle = open(tmp_path / "log.txt", "w")

    @sluice.remote
    def write(line: str) -> None:
        handle.write(line)

    with pytest.raises(SerializationError, match=r"the function: cannot send <_io.TextIOWrapper name="):
        write.spawn("x")
    with pytest.raises(SerializationError, match=r"keyword argument 'lock'"):
        pack_call(print, (), {"lock": threading.Lock()})


def test_import_hints_are_scanned_from_the_function() -> None:
    import json as json_module

    def fn(x: int) -> object:
        import os.path
        from collections import OrderedDict

        def inner() -> object:
            import statistics
            return statistics
        return json_module.dumps(np.zeros(x).tolist()), os.path, OrderedDict, inner

    assert import_hints(fn) == ["collections", "json", "numpy", "os", "statistics"]
    assert sluice.remote(fn).hints == ["collections", "json", "numpy", "os", "statistics"]


# ---- Signing ----------------------------------------------------------------------------------

def test_signed_messages_round_trip_and_tampering_is_refused() -> None:
    message = seal("secret", {"payload": encode(b"data"), "memory": 1})
    assert decode(unseal("secret", message)["payload"]) == b"data"
    for tampered in ({**message, "payload": encode(b"evil")}, {**message, "memory": 2}):
        with pytest.raises(InvalidRequestError, match="signature does not match"):
            unseal("secret", tampered)
    with pytest.raises(InvalidRequestError, match="signature does not match"):
        unseal("other-secret", message)
    with pytest.raises(InvalidRequestError, match="not signed"):
        unseal("secret", {"payload": encode(b"data")})
    with pytest.raises(InvalidRequestError, match="SLUICE_REMOTE_SECRET"):
        unseal(None, message)
    with pytest.raises(ConfigurationError, match="SLUICE_REMOTE_SECRET"):
        seal(None, {"payload": ""})


# ---- Environment cache ------------------------------------------------------------------------

def _fake_env(root: Path, key: str, size: int, mtime: float) -> Path:
    path = root / key
    path.mkdir(parents=True)
    (path / "blob").write_bytes(b"x" * size)
    (path / READY).write_text(key)
    import os
    os.utime(path / READY, (mtime, mtime))
    return path


def test_environment_cache_evicts_least_recently_used_past_its_cap(tmp_path: Path) -> None:
    old = _fake_env(tmp_path, "old", 4000, 1_000)
    mid = _fake_env(tmp_path, "mid", 4000, 2_000)
    new = _fake_env(tmp_path, "new", 4000, 3_000)
    cache = EnvironmentCache(tmp_path, max_bytes=9000)
    assert cache.evict(keep=new) == [old]
    assert mid.exists() and new.exists() and not old.exists()
    assert EnvironmentCache(tmp_path, max_bytes=1).evict(keep=new) == [mid]  # never the one in use


def test_pickle_protocol_is_plain_pickle_compatible() -> None:
    assert pickle.loads(dumps({"a": 1})) == {"a": 1}
