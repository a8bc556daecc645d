"""Assets on real workers (Executor.kubernetes): routing per step, escalation, values through Redis."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import sluice as sl
from sluice.assets.store import RedisStore
from sluice.deploy.embedded import EmbeddedRedis
from tests.apps import reference_assets
from tests.conftest import Workers

pytestmark = pytest.mark.integration
FAST = ("-c", "1", "--without-mingle", "--without-gossip")


def test_reference_samples_on_the_default_ladder(redis_server: EmbeddedRedis, workers: Workers) -> None:
    for queue in ("cpu", "highmem"):
        workers.start("tests.apps.basic", queue, f"{queue}-assets", *FAST)
    workers.start("tests.apps.basic", "gpu", "gpu-assets", "--allow-no-gpu", *FAST, env={"SLUICE_GPU_COUNT": "0"})
    executor = sl.Executor.kubernetes(worker_cpu="1", worker_memory="512Mi")
    result = reference_assets.repository(executor).materialize()
    assert result.success, {n: a.error for n, a in result.assets.items()}
    where = {name: asset.where.split()[0] for name, asset in result.assets.items()}
    assert where == {"skewed_join": "highmem", "big": "highmem", "train": "gpu", "sometimes_bigger": "highmem",
                     "orders": "highmem", "customers": "highmem", "report": "cpu"}
    assert result.value("big")["compute"] == {"cpu": "1", "memory": "32Gi"}        # cpu inherited per axis
    assert result.value("train")["compute"] == {"cpu": "1", "memory": "16Gi", "gpu": 1}
    assert result.value("report") == "3 orders from 2 customers; join ran as {'cpu': '4', 'memory': '32Gi'}"


def test_small_ladder_routes_up_and_escalates_a_memory_kill(redis_server: EmbeddedRedis, workers: Workers) -> None:
    workers.start("tests.apps.ladder", "small", "ladder-assets", "--queue", "medium", "--queue", "large", "-c", "2",
                  "--without-mingle", "--without-gossip")
    ladder_assets = importlib.import_module("tests.apps.ladder_assets")
    result = ladder_assets.repo.materialize()
    assert result.success, {n: a.error for n, a in result.assets.items()}
    assert result.assets["wide"].where == "medium (ladder-assets@test)"
    assert result.value("wide") == {"total": 45, "compute": {"cpu": "1", "memory": "250Mi"}}
    hungry = result.assets["hungry"]
    assert [(a["queue"], a["reason"]) for a in hungry.attempts] == [("small", "memory"), ("medium", "succeeded")]
    assert result.value("hungry") == {"attempt": 2, "memory": "300Mi", "n": 10}
    assert result.value("combined") == {"wide": 45, "hungry_attempt": 2}
    client = redis_server.client()
    runs = {name: int(client.get(f"test:asset-runs:{result.run_id}:{name}")) for name in result.assets}
    assert runs == {"source": 1, "wide": 1, "hungry": 2, "combined": 1}


def test_large_values_spill_to_the_shared_path(redis_server: EmbeddedRedis, tmp_path: Path) -> None:
    store = RedisStore(redis_server.client(), tmp_path, "a secret", inline_limit=1024)
    store.put("run1", "small", [1, 2])
    store.put("run1", "large", b"x" * 10_000)
    assert store.get("run1", "small") == [1, 2] and store.get("run1", "large") == b"x" * 10_000
    assert [p.name for p in (tmp_path / "run1").iterdir()] == ["large.pickle"]
    with pytest.raises(KeyError, match="no stored value for asset 'missing'"):
        store.get("run1", "missing")


def test_a_step_defined_in_main_is_refused_before_anything_runs(redis_server: EmbeddedRedis) -> None:
    def orphan(ctx):
        return 1

    orphan.__module__ = "__main__"
    repo = sl.CodeRepository([sl.Asset()(orphan)])
    with pytest.raises(sl.DefinitionError, match="defined in __main__"):
        repo.materialize(executor=sl.Executor.kubernetes())


class _Plant:
    """A pickle that, when loaded, creates the file named ``marker``: stands in for any code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def test_a_planted_or_tampered_asset_value_is_never_unpickled_on_a_worker_and_a_signed_one_is(
        redis_server: EmbeddedRedis, workers: Workers, tmp_path: Path) -> None:
    """A signed run_step message whose inputs are values the store signed, one inline in Redis
    and one spilled to a file, runs on a worker with the secret (the control: this path does load
    values). The same message with an input that is an unsigned pickle, or a spilled file rewritten
    after the store wrote it, is refused with the reason for that case, and the pickle never runs;
    on a worker without the secret even the signed message is refused, before any value is read."""
    import cloudpickle

    from sluice import App, keys
    from sluice.assets.step_task import RUN_STEP_TASK, step_signature
    from sluice.errors import InvalidRequestError

    workers.start("tests.apps.basic", "cpu", "signed-assets", *FAST)
    workers.start("tests.apps.basic", "highmem", "no-secret-assets", *FAST,
                  env={"SLUICE_REMOTE_SECRET": "", "SLUICE_HOME": str(tmp_path / "elsewhere")})
    client, app = redis_server.client(), App.default()
    secret = app.settings.signing_secret()
    ref = reference_assets.report.ref
    inline, spilled = RedisStore(client, tmp_path / "store", secret), RedisStore(client, tmp_path / "store", secret, 0)
    inline.put("evil", "orders", ["o1", "o2", "o3"])
    spilled.put("evil", "customers", ["c1", "c2"])
    inline.put("evil", "join", {"compute": "signed"})
    spilled_file = Path(client.get(keys.asset_value("evil", "customers")).decode().removeprefix("file:"))
    assert spilled_file.is_file()

    def run_step(queue: str, **planted: str) -> object:
        inputs = {"orders": ["evil", "orders"], "customers": ["evil", "customers"], "skewed_join": ["evil", "join"]}
        inputs |= {param: ["evil", asset] for param, asset in planted.items()}
        args = [ref, "evil", inputs, str(tmp_path / "store")]      # a signed step: only its inputs are planted
        result = app.send_task(RUN_STEP_TASK, args=args, kwargs={"sig": step_signature(secret, *args)}, queue=queue)
        return result.get(timeout=60)

    assert run_step("cpu") == {"queue": "cpu", "worker": "signed-assets@test", "attempt": 1}
    assert inline.get("evil", "report") == "3 orders from 2 customers; join ran as signed"   # both values loaded

    client.set(keys.asset_value("evil", "unsigned"), cloudpickle.dumps(_Plant(str(tmp_path / "unsigned-ran"))))
    with pytest.raises(InvalidRequestError) as unsigned:
        run_step("cpu", orders="unsigned")
    assert str(unsigned.value) == ("refusing the value of asset 'unsigned' of run evil: it is not signed "
                                   "(nothing was unpickled or run)")

    signed = spilled_file.read_bytes()
    header = signed[:len(signed) - len(cloudpickle.dumps(["c1", "c2"]))]    # the signature the store wrote
    spilled_file.write_bytes(header + cloudpickle.dumps(_Plant(str(tmp_path / "tampered-ran"))))
    with pytest.raises(InvalidRequestError) as tampered:
        run_step("cpu")
    assert str(tampered.value) == ("refusing the value of asset 'customers' of run evil: its signature does not "
                                   "match (tampered, or signed with another secret; nothing was unpickled or run)")

    spilled_file.write_bytes(signed)                               # signed again: only the worker lacks the secret
    with pytest.raises(InvalidRequestError) as no_secret:
        run_step("highmem")
    assert str(no_secret.value).startswith(f"refusing asset step {ref!r}: this process has no signing secret")
    assert not (tmp_path / "unsigned-ran").exists() and not (tmp_path / "tampered-ran").exists()
    cloudpickle.loads(cloudpickle.dumps(_Plant(str(tmp_path / "control-ran")))).close()
    assert (tmp_path / "control-ran").exists()                     # unpickled, a plant does leave its file
