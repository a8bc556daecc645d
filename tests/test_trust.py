"""What write access to Redis alone can do to a worker: no code it was not sent by a holder of the
signing secret runs there. Each attack is what a Redis writer can do with redis-cli or a plain
Celery producer: plant a run's task file, forge a JSON message naming a task every sluice worker
registers, push a pickled message; the worker refuses each before running or unpickling any of
it, and the caller's error names the signature or the missing secret."""

from __future__ import annotations

import os
import pickle
import types
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from sluice import keys
from sluice.assets.step_task import RUN_STEP_TASK, step_signature
from sluice.deploy.embedded import EmbeddedRedis
from sluice.errors import InvalidRequestError
from sluice.queues.broker.layout import RedisLayout
from sluice.tasks.batch import RUN_CHUNK_TASK
from sluice.tasks.batch.records import Failure, decode
from sluice.tasks.batch.taskfile import TaskFile
from tests.conftest import Workers, wait_for
from tests.test_batch import EXAMPLE, compute, lines

pytestmark = pytest.mark.integration
FAST = ("-c", "1", "--without-mingle", "--without-gossip")


def attacker(redis_server: EmbeddedRedis) -> Celery:
    """A plain Celery producer on the cluster's Redis: all a Redis writer needs to send tasks."""
    return Celery("attacker", broker=redis_server.url, backend=redis_server.url)


def planted(marker: Path, filename: str = "planted.py") -> TaskFile:
    """A task file whose import writes ``marker`` (built without running it)."""
    source = (f"open({str(marker)!r}, 'w').write('ran')\n"
              "def plan():\n    yield {'id': 'a'}\n\ndef execute(item):\n    return {'ok': True}\n")
    return TaskFile(filename, source, [], types.ModuleType("unrun"))


def plant(client: redis.Redis, run_id: str, fields: dict[str, str]) -> None:
    client.delete(keys.run(run_id, "source"))
    client.hset(keys.run(run_id, "source"), mapping=fields)


def unsigned(task_file: TaskFile, run_id: str) -> dict[str, str]:
    return {k: v for k, v in task_file.sealed(run_id, "any").items() if k != "sig"}


def refused_chunk(celery: Celery, client: redis.Redis, run_id: str, match: str) -> None:
    """Send one chunk of ``run_id`` to the cpu class; it fails with InvalidRequestError matching
    ``match``, and its item's failure record (what the driver sinks) says the same."""
    result = celery.send_task(RUN_CHUNK_TASK, args=[run_id, [{"id": "a"}]], queue="cpu")
    with pytest.raises(InvalidRequestError, match=match):
        result.get(timeout=60)
    # Celery stores the failure, then sends task_failure, whose handler writes the items' records
    record = decode(wait_for(lambda: client.hget(keys.run(run_id, "results"), "a"), 10, "the item's record"))
    assert isinstance(record, Failure) and record.error == "InvalidRequestError", record
    assert f"refusing the task file of batch run {run_id!r}" in record.message


def test_a_planted_task_file_never_runs_on_a_worker_without_the_secret(
        redis_server: EmbeddedRedis, redis_client: redis.Redis, workers: Workers, tmp_path: Path) -> None:
    """A worker with no secret runs no stored task file: not an unsigned one planted with one HSET,
    nor one correctly signed (it cannot check it). The chunk fails naming the missing secret."""
    workers.start("tests.apps.basic", "cpu", "no-secret", *FAST,
                  env={"SLUICE_REMOTE_SECRET": "", "SLUICE_HOME": str(tmp_path / "elsewhere")})
    secret = os.environ["SLUICE_REMOTE_SECRET"]
    plant(redis_client, "evil-unsigned", unsigned(planted(tmp_path / "unsigned-ran"), "evil-unsigned"))
    plant(redis_client, "evil-signed", planted(tmp_path / "signed-ran").sealed("evil-signed", secret))
    for run_id in ("evil-unsigned", "evil-signed"):
        refused_chunk(attacker(redis_server), redis_client, run_id, "no signing secret.*SLUICE_REMOTE_SECRET")
    assert not (tmp_path / "unsigned-ran").exists() and not (tmp_path / "signed-ran").exists()


def test_a_worker_with_the_secret_runs_a_stored_task_file_only_when_signed_for_its_run(
        redis_server: EmbeddedRedis, redis_client: redis.Redis, workers: Workers, tmp_path: Path) -> None:
    """Unsigned, signed with another secret, or signed for another run and copied under this one's
    id: each is refused before any of it runs, the error naming the signature. The same file
    signed for its run does run (the marker shows the worker would have run the others)."""
    workers.start("tests.apps.basic", "cpu", "with-secret", *FAST)
    secret, celery = os.environ["SLUICE_REMOTE_SECRET"], attacker(redis_server)
    attacks = {"evil-unsigned": (unsigned(planted(tmp_path / "unsigned-ran"), "evil-unsigned"), "it is not signed"),
               "evil-other-secret": (planted(tmp_path / "other-ran").sealed("evil-other-secret", "guessed"),
                                     "signature does not match"),
               "evil-copied": (planted(tmp_path / "copied-ran").sealed("a-signed-run", secret),
                               "signed for batch run 'a-signed-run'")}
    for run_id, (fields, reason) in attacks.items():
        plant(redis_client, run_id, fields)
        refused_chunk(celery, redis_client, run_id, reason)
    assert not [name for name in ("unsigned-ran", "other-ran", "copied-ran") if (tmp_path / name).exists()]
    plant(redis_client, "signed", planted(tmp_path / "signed-ran").sealed("signed", secret))
    assert celery.send_task(RUN_CHUNK_TASK, args=["signed", [{"id": "a"}]], queue="cpu").get(timeout=60) == 1
    assert (tmp_path / "signed-ran").read_text() == "ran"


def test_a_forged_asset_step_imports_nothing(redis_server: EmbeddedRedis, workers: Workers, tmp_path: Path) -> None:
    """A run_step message names a module for the worker to import and a path to write under: one
    unsigned, or signed with another secret, is refused before the module is imported."""
    marker = tmp_path / "imported"
    workers.start("tests.apps.basic", "cpu", "steps", *FAST, env={"TEST_IMPORT_MARKER": str(marker)})
    args = ["tests.apps.import_marker:step", "evil", {}, str(tmp_path / "store")]
    celery = attacker(redis_server)
    for kwargs, reason in (({}, "it is not signed"), ({"sig": step_signature("guessed", *args)}, "does not match")):
        with pytest.raises(InvalidRequestError, match=f"refusing asset step 'tests.apps.import_marker:step': .*{reason}"):
            celery.send_task(RUN_STEP_TASK, args=args, kwargs=kwargs, queue="cpu").get(timeout=60)
    assert not marker.exists()
    # the control: signed with the cluster's secret, the same message does import the module
    signed = {"sig": step_signature(os.environ["SLUICE_REMOTE_SECRET"], *args)}
    celery.send_task(RUN_STEP_TASK, args=args, kwargs=signed, queue="cpu").get(timeout=60, propagate=False)
    assert marker.exists(), "the planted module was never importable: the test above proved nothing"


class _Opens:
    """Unpickling this creates the file: what a pickled message would run on a worker that unpickled it."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return open, (self.path, "w")


def test_a_pickled_message_is_never_unpickled(redis_server: EmbeddedRedis, redis_client: redis.Redis,
                                              workers: Workers, tmp_path: Path) -> None:
    """The queues take JSON only: a pickle-serialized message naming a task every worker has
    becomes a dead letter and nothing in it is unpickled (pins the README's "JSON-only queues")."""
    workers.start("tests.apps.basic", "cpu", "json-only", *FAST)
    marker = tmp_path / "unpickled"
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_Opens(control)))   # the control: unpickling it does create its file
    assert control.exists() and not marker.exists()
    attacker(redis_server).send_task(RUN_CHUNK_TASK, args=[_Opens(marker)], queue="cpu", serializer="pickle")
    dead = RedisLayout().dead_letters("cpu")
    wait_for(lambda: redis_client.llen(dead), 60, "the pickled message to become a dead letter")
    assert not marker.exists()


def test_compute_on_the_cluster_says_why_a_worker_refused_the_run(
        redis_server: EmbeddedRedis, workers: Workers, tmp_path: Path) -> None:
    """`sluice compute` against a cluster whose worker lacks the secret: every item fails (lost,
    so --resume runs it again once the worker has the secret), and the run says why once."""
    workers.start("tests.apps.basic", "cpu", "cluster-no-secret", *FAST,
                  env={"SLUICE_REMOTE_SECRET": "", "SLUICE_HOME": str(tmp_path / "elsewhere")})
    sink = tmp_path / "sink"
    result = compute(str(EXAMPLE), "--broker", redis_server.url, "--sink", str(sink), "--", "--n", "3",
                     home=tmp_path, timeout=90)
    assert result.returncode == 1, result.stderr
    stderr = " ".join(result.stderr.split())
    assert stderr.count("a worker refused item") == 1 and "no signing secret" in stderr, result.stderr
    failures = lines(sink / "failures.ndjson")
    assert sorted(f["id"] for f in failures) == ["t-0", "t-1", "t-2"]
    assert {(f["status"], f["error"]) for f in failures} == {("lost", "InvalidRequestError")}


def test_compute_on_the_cluster_without_a_secret_stops_before_storing_anything(
        redis_server: EmbeddedRedis, redis_client: redis.Redis, tmp_path: Path) -> None:
    """Without -w and without a secret the run could only be refused: it exits 2 naming
    SLUICE_REMOTE_SECRET, and nothing of it reaches Redis."""
    result = compute(str(EXAMPLE), "--broker", redis_server.url, "--", "--n", "3", home=tmp_path, timeout=60,
                     SLUICE_REMOTE_SECRET="")
    said = " ".join(result.stderr.split())   # `sluice` prints its one-line errors on stderr
    assert result.returncode == 2, said
    assert "without -w" in said and "SLUICE_REMOTE_SECRET" in said, said
    assert not list(redis_client.scan_iter(match=keys.run("*", "*")))


def test_local_workers_without_a_configured_secret_get_one_of_the_run(
        redis_server: EmbeddedRedis, redis_client: redis.Redis, tmp_path: Path) -> None:
    """`-w N` with no secret set: the driver makes one for the run and hands it to its own workers
    in their environment, so the stored task file is signed all the same and the run completes."""
    result = compute(str(EXAMPLE), "-w", "1", "--broker", redis_server.url, "--run-id", "own-secret",
                     "--results", "ndjson", "--", "--n", "5", home=tmp_path, SLUICE_REMOTE_SECRET="")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 5
    stored = {k.decode(): v.decode() for k, v in redis_client.hgetall(keys.run("own-secret", "source")).items()}
    assert stored["run"] == "own-secret" and len(stored["sig"]) == 64
    with pytest.raises(InvalidRequestError, match="does not match"):   # not the cluster's: the run's own
        TaskFile.unsealed("own-secret", {k.encode(): v.encode() for k, v in stored.items()},
                          os.environ["SLUICE_REMOTE_SECRET"])


def test_torchrun_ranks_meeting_through_redis_need_the_real_secret(redis_server: EmbeddedRedis,
                                                                   tmp_path: Path) -> None:
    """Under torchrun with a broker the ranks meet through Redis, which must not carry a secret of
    the run's own: without SLUICE_REMOTE_SECRET every rank stops at once (exit 2) naming it."""
    launch = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "no-secret"}
    for rank in ("1", "0"):
        result = compute(str(EXAMPLE), "--broker", redis_server.url, "--", "--n", "3", home=tmp_path, timeout=60,
                         SLUICE_REMOTE_SECRET="", RANK=rank, LOCAL_RANK=rank, **launch)
        said = " ".join((result.stdout + result.stderr).split())
        assert result.returncode == 2 and "meet through Redis" in said and "SLUICE_REMOTE_SECRET" in said, said
