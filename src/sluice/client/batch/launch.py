"""What ``sluice compute task.py`` does: start a batch run (its broker, secret, sink, local workers
and torchrun ranks), drive it to its end, and say how it ended; or ``--check`` a task file here."""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any

import click
import redis
from rich.markup import escape

from sluice import redis_client, terminal
from sluice.app import App
from sluice.client.batch import finalise, runs, torchrun
from sluice.client.batch.driver import Driver
from sluice.client.batch.local_workers import LocalWorkers
from sluice.client.batch.observe import Observer
from sluice.client.batch.progress import EXIT_BROKER_LOST, EXIT_INTERRUPTED, RunSettings
from sluice.client.batch.sink import Sink
from sluice.client.batch.torchrun import Ranks
from sluice.client.batch.trajectory import require_lance, write_trajectory
from sluice.config import Settings
from sluice.deploy.embedded import EmbeddedRedis
from sluice.errors import ConfigurationError, InvalidRequestError
from sluice.queues.broker.publishing import PublishError
from sluice.signing import NO_SECRET
from sluice.tasks.batch.records import Failure, Record, decode, encode, execute_item
from sluice.tasks.batch.taskfile import TaskFile

console = terminal.console(stderr=True)


@dataclass(frozen=True)
class RunOptions:
    """What the command line asked of a run (``sluice compute --help`` explains each)."""

    workers: int | None
    per_worker: int
    python: str
    retries: int
    results_mode: str
    resume: bool
    rerun_failed: bool
    observe: bool
    quarantine_after: int
    tenant: str | None = None


def run_task_file(
    tf: TaskFile, options: RunOptions, sink: Path | None, broker: str | None, run_id: str | None, keep: bool, traj: bool
) -> int:
    """A run of ``tf``'s items on workers, into ``sink`` (default: the run's own directory), on
    ``broker`` (default: the configured one, else a Redis of the run's own); returns the exit code.
    Under torchrun, rank 0 drives the run and every other rank serves it with local workers."""
    if traj:
        require_lance()
    settings = Settings.load()
    ranks = Ranks.from_env()
    if ranks is not None and ranks.world_size > 1:
        options = replace(options, workers=options.workers or 1)  # under torchrun every rank runs local workers
        if not ranks.drives:
            return _serve_rank(
                ranks, broker or settings.broker_url, options.workers or 1, options.per_worker, options.python, settings
            )
    else:
        ranks = None
    url = broker or settings.broker_url
    if url is None and options.workers is None:
        options = replace(options, workers=1)
    secret = run_secret(settings, options.workers is not None, meet_through_redis=ranks is not None and url is not None)
    if run_id is None:
        run_id = hashlib.sha1(str(sink.resolve()).encode()).hexdigest()[:16] if sink else uuid.uuid4().hex[:16]
    sink_dir = sink or runs.run_dir(settings.home, run_id)
    if sink and not options.resume and any((sink_dir / n).exists() for n in ("ready.ndjson", "failures.ndjson")):
        raise click.UsageError(
            f"{sink_dir} already holds results: pass --resume to continue that run, or use a fresh --sink directory"
        )
    runs.sweep(settings.home, settings.run_ttl)
    embedded = None
    if url is None:  # a Redis of the run's own (a second run never shares its append-only file)
        where = runs.redis_dir(settings.home, run_id)
        owner = f"sluice compute run {run_id}"
        embedded = (
            EmbeddedRedis(where, bind=ranks.bind_address, host=ranks.master_addr, owner=owner)
            if ranks
            else EmbeddedRedis(where, owner=owner)
        )
        url = embedded.start().url
    record = runs.RunRecord.begin(
        settings.home, run_id, sink_dir, runs.describe_broker(None if embedded else url), keep
    )
    code = EXIT_INTERRUPTED
    try:
        client = redis_client.connect(url, settings=settings)
        runs.hold(client, run_id)
        if ranks:
            torchrun.reset(client, run_id)
            own = {} if secret == settings.signing_secret() else {"secret": secret}  # never the cluster's
            torchrun.share_run(
                ranks,
                {"broker": url, "run_id": run_id, "queue": runs.private_queue(run_id), **own},
                broker or settings.broker_url,
            )
        code = _run(tf, url, run_id, sink_dir, options, settings, secret, ranks)
        if ranks:
            torchrun.release(client, ranks, run_id, code)
        if code != EXIT_BROKER_LOST:
            runs.expire(client, run_id, settings.run_ttl)
    finally:
        record.end(settings.home, code)
        if embedded is not None:
            embedded.stop()
    if traj:
        path, rows = write_trajectory(sink_dir)
        console.print(f"wrote Lance dataset {path} ({rows} rows)")
    return code


def check(tf: TaskFile, count: int) -> int:
    """``sluice compute --check``: the first ``count`` items in this process, each printed as the record a real
    run would write (encoded the same way); exit 1 if any failed, as a real run does."""
    failed = 0
    for item in islice(tf.plan(), count):
        _, line = execute_item(tf.execute, item, "check", 1)
        record = decode(line)
        click.echo(line)
        if isinstance(record, Failure):
            failed += 1
            console.print(f"[red]{record.id}: {record.error}: {record.message}[/red]")
    return 1 if failed else 0


def run_secret(settings: Settings, local_workers: bool, meet_through_redis: bool = False) -> str:
    """The secret that signs the run's task file (a worker runs no task file without it): the
    configured one, else, for a run only its own local workers serve, a fresh one that the driver
    hands them (and other torchrun ranks, through torch's store) in their environment, never
    through Redis. A run on the cluster's workers needs theirs."""
    configured = settings.signing_secret()
    if configured:
        return configured
    if not local_workers:
        raise ConfigurationError(
            "sluice compute without -w runs on the cluster's workers, which run a task file "
            f"only when it is signed with their secret; this process has {NO_SECRET}"
        )
    if meet_through_redis:
        raise ConfigurationError(
            "under torchrun with a broker the ranks meet through Redis, which must never hold "
            "the secret that signs the task file: set SLUICE_REMOTE_SECRET to the same value "
            "on every rank"
        )
    return secrets.token_hex(32)


def _serve_rank(
    ranks: Ranks, broker: str | None, workers: int, per_worker: int, python: str, settings: Settings
) -> int:
    """A torchrun rank other than 0: run local workers for rank 0's run until it ends."""
    own = run_secret(settings, local_workers=True, meet_through_redis=broker is not None)
    run = torchrun.share_run(ranks, None, broker)
    client = redis_client.connect(run["broker"], settings=settings)
    local = LocalWorkers(
        workers,
        per_worker,
        run["queue"],
        run["run_id"],
        python,
        runs.run_dir(settings.home, run["run_id"]) / f"rank-{ranks.rank}-logs",
        {"SLUICE_BROKER_URL": run["broker"], "SLUICE_REMOTE_SECRET": run.get("secret") or own},
        prefix=f"r{ranks.rank}.",
    ).start()
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    code = None
    try:
        while code is None and not stop.wait(0.5):
            code = torchrun.finished(client, run["run_id"])
            local.revive()
    except redis.ConnectionError:
        console.print(f"rank {ranks.rank}: the run's Redis went away before the run ended")
    finally:
        local.stop(interrupt=code is None)
    if code is not None:
        torchrun.leave(client, run["run_id"])
    return EXIT_INTERRUPTED if code is None else code


def _run(
    tf: TaskFile,
    url: str,
    run_id: str,
    sink_dir: Path,
    options: RunOptions,
    settings: Settings,
    secret: str,
    ranks: Ranks | None = None,
) -> int:
    """One run of ``tf`` on the broker at ``url``, into ``sink_dir``, its task file signed with
    ``secret``; returns the exit code."""
    workers, per_worker = options.workers, options.per_worker
    app = App("sluice.compute", broker=url)
    app.conf.task_send_sent_event = False  # one event per chunk would double the driver's publishing
    run_compute = (tf.compute or app.default_compute).inherit(app.default_compute)
    queue = runs.private_queue(run_id) if workers else app.catalog.route(run_compute, tf.filename).name
    store = Sink(sink_dir).open()
    if store.repaired:
        console.print(f"repaired a torn last line in {', '.join(store.repaired)}")
    done = store.done_ids(options.rerun_failed) if options.resume else set()
    local = (
        LocalWorkers(
            workers,
            per_worker,
            queue,
            run_id,
            options.python,
            sink_dir / "logs",
            {"SLUICE_BROKER_URL": url, "SLUICE_REMOTE_SECRET": secret},
            prefix="r0." if ranks else "",
        ).start()
        if workers
        else None
    )
    slots = workers * per_worker * (ranks.world_size if ranks else 1) if workers else 8
    printer = _Refusals(_print_record if options.results_mode == "ndjson" else _ignore)
    with Observer(console) if options.observe else _NoObserver() as observer:

        def on_progress(progress: Any) -> None:
            observer(progress)
            if local is not None and not driver.stopping:
                for index in local.revive():
                    console.print(f"local worker {index} died; restarted it")

        run_settings = RunSettings(
            run_id,
            queue,
            retries=options.retries,
            quarantine_after=options.quarantine_after,
            rerun_failed=options.rerun_failed,
            tenant=options.tenant,
        )
        driver = Driver(app, tf, store, run_settings, slots, on_record=printer, on_progress=on_progress, secret=secret)
        if not options.resume:
            driver.reset()
        _handle_interrupts(driver)
        lost_broker = False
        try:
            code = driver.run(done)
        except (redis.ConnectionError, redis.TimeoutError, PublishError) as exc:
            console.print(
                f"[red]lost the broker for over {app.settings.outage_wait:.0f} s ({exc}); nothing "
                "counts as failed: run again with --resume once Redis is back[/red]"
            )
            lost_broker, code = True, EXIT_BROKER_LOST
        finally:
            ending = driver.stopping or lost_broker
            if local is not None:
                local.stop(interrupt=ending, idle=not ending and finalise.wait_for_acks(driver))
    if driver.stopping and not lost_broker:
        finalise.finish_interrupted(driver, private_queue=local is not None)
        code = EXIT_INTERRUPTED
    store.close()
    if options.results_mode != "quiet":
        p = driver.progress
        console.print(
            f"run {run_id}: {p.ok} ok, {p.failed} failed, {p.cancelled} cancelled, {p.skipped} skipped "
            f"(already in the sink), {p.duplicates} duplicate ids; {p.rate():.0f} items/s; sink {sink_dir}"
        )
    return code


def _handle_interrupts(driver: Driver) -> None:
    def on_interrupt(_signum: int, _frame: Any) -> None:
        if driver.stopping:
            os._exit(EXIT_INTERRUPTED)  # second Ctrl-C: exit at once
        console.print(
            "[yellow]interrupted: stopping; unstarted items are recorded as cancelled "
            "(Ctrl-C again to exit at once)[/yellow]"
        )
        driver.interrupt()

    signal.signal(signal.SIGINT, on_interrupt)
    signal.signal(signal.SIGTERM, on_interrupt)


def _print_record(record: Record) -> None:
    click.echo(encode(record))


def _ignore(_record: Record) -> None:
    return None


class _Refusals:
    """Passes each record on, and says once per reason why workers refused the run's chunks (an
    unsigned task file, a worker without the secret): otherwise the run would only count failures."""

    def __init__(self, then: Callable[[Record], None]) -> None:
        self.then = then
        self.seen: set[str] = set()

    def __call__(self, record: Record) -> None:
        self.then(record)
        if (
            isinstance(record, Failure)
            and record.error == InvalidRequestError.__name__
            and record.message not in self.seen
        ):
            self.seen.add(record.message)
            console.print(f"[red]a worker refused item {escape(record.id)}'s chunk: {escape(record.message)}[/red]")


class _NoObserver:
    def __enter__(self) -> _NoObserver:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, _progress: object) -> None:
        return None
