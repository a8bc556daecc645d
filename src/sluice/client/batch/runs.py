"""The runs of ``sluice compute`` and what they leave behind, which expires.

Each run has a directory of its own, ``<home>/runs/<run id>/``: ``run.json`` (the run's record),
``redis/`` (its embedded Redis, when no broker was given: one per run, so two runs never share an
append-only file) and, for a run without ``--sink``, the sink itself. A run's keys in Redis
(SkipSet, result cache, source, its private queue) are only what recovery needs while it may
resume: when the run ends they get a TTL of ``run_ttl`` (and lose it again if the run resumes).
The run's directory goes on the same schedule unless the run was kept (``--keep``); a sink given
with ``--sink`` is the user's and is never deleted. ``sluice runs`` lists runs, ``sluice runs
forget`` deletes one now.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import redis

from sluice import keys
from sluice.deploy.embedded import private_dir
from sluice.queues.broker.layout import RedisLayout


def private_queue(run_id: str) -> str:
    """The queue local workers of a run consume (and nothing else does)."""
    return f"sluice.run.{run_id}"


def run_dir(home: Path, run_id: str) -> Path:
    """The run's own directory (and its default sink)."""
    return home / "runs" / run_id


def redis_dir(home: Path, run_id: str) -> Path:
    """Where the run's embedded Redis keeps its data, when the run has no broker."""
    return run_dir(home, run_id) / "redis"


def run_keys(run_id: str, layout: RedisLayout = RedisLayout()) -> list[str]:
    """Every Redis key a run may have written: its parts and its private queue's lists."""
    return [keys.run(run_id, part) for part in keys.RunPart] + layout.queue_lists(private_queue(run_id))


def expire(client: redis.Redis, run_id: str, ttl: float) -> None:
    """The run ended: its keys go ``ttl`` seconds from now (one round trip)."""
    pipe = client.pipeline(transaction=False)
    for key in run_keys(run_id):
        pipe.expire(key, max(1, int(ttl)))
    pipe.execute()


def hold(client: redis.Redis, run_id: str) -> None:
    """The run (re)starts: its keys stay for as long as it runs."""
    pipe = client.pipeline(transaction=False)
    for key in run_keys(run_id):
        pipe.persist(key)
    pipe.execute()


def redis_bytes(client: redis.Redis, run_id: str) -> int:
    """What the run's keys take in Redis (``MEMORY USAGE``, sampled for big hashes and sets)."""
    pipe = client.pipeline(transaction=False)
    for key in run_keys(run_id):
        pipe.memory_usage(key)
    return sum(size or 0 for size in pipe.execute())


def disk_bytes(path: Path) -> int:
    """The bytes of every file under ``path`` (0 if it is gone)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


@dataclass
class RunRecord:
    """``run.json``: what ``sluice runs`` shows of a run and what its expiry needs."""

    run_id: str
    sink: str
    #: "embedded" (its own Redis in ``redis/``) or the broker's host:port/db (no password)
    broker: str
    started: float
    pid: int
    keep: bool = False
    ended: float | None = None
    exit_code: int | None = None

    @classmethod
    def begin(cls, home: Path, run_id: str, sink: Path, broker: str, keep: bool) -> RunRecord:
        record = cls(run_id, str(sink.resolve()), broker, time.time(), os.getpid(), keep)
        previous = cls.read(home, run_id)
        record.keep = keep or bool(previous and previous.keep)  # once kept, a resumed run stays kept
        record.write(home)
        return record

    def end(self, home: Path, code: int) -> None:
        self.ended, self.exit_code = time.time(), code
        self.write(home)

    def write(self, home: Path) -> None:
        path = private_dir(run_dir(home, self.run_id)) / "run.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)

    @classmethod
    def read(cls, home: Path, run_id: str) -> RunRecord | None:
        try:
            return cls(**json.loads((run_dir(home, run_id) / "run.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    @property
    def running(self) -> bool:
        return self.ended is None and psutil.pid_exists(self.pid) and self.pid != os.getpid()

    @property
    def default_sink(self) -> bool:
        return Path(self.sink).name == self.run_id and Path(self.sink).parent.name == "runs"

    def expires_at(self, ttl: float) -> float | None:
        """When the run's directory goes (None: kept, or still running). A run that died without
        ending expires from its start."""
        if self.keep or self.running:
            return None
        return (self.ended or self.started) + ttl


def records(home: Path) -> Iterator[RunRecord]:
    """Every run this home has a record of, newest first."""
    found = [RunRecord.read(home, path.parent.name) for path in (home / "runs").glob("*/run.json")]
    yield from sorted((r for r in found if r is not None), key=lambda r: r.started, reverse=True)


def sweep(home: Path, ttl: float, now: float | None = None) -> list[str]:
    """Delete the directories of runs past their expiry (never a kept or running one, never a
    ``--sink`` given by the user); returns the ids deleted."""
    now = time.time() if now is None else now
    gone = []
    for record in records(home):
        due = record.expires_at(ttl)
        if due is not None and due <= now:
            shutil.rmtree(run_dir(home, record.run_id), ignore_errors=True)
            gone.append(record.run_id)
    return gone


def forget(home: Path, record: RunRecord, client: redis.Redis | None) -> None:
    """Delete a run now: its keys on ``client`` (its broker, when it has one) and its directory."""
    if client is not None:
        client.delete(*run_keys(record.run_id))
    shutil.rmtree(run_dir(home, record.run_id), ignore_errors=True)


def describe_broker(url: str | None) -> str:
    """How run.json names a run's broker: "embedded", or host:port/db without the password."""
    if url is None:
        return "embedded"
    try:
        parts = redis.connection.parse_url(url)
    except ValueError:
        return "the configured broker"
    return f"{parts.get('host', '?')}:{parts.get('port', 6379)}/{parts.get('db', 0)}"
