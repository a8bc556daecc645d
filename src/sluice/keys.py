"""Every Redis key sluice writes, in one place, all under the ``sluice:`` prefix."""

from enum import StrEnum

PREFIX = "sluice:"

#: Seconds a memory-kill record is kept (long enough to explain a failure after the fact).
MEMORY_KILL_TTL = 7 * 24 * 3600


def worker_heartbeat(hostname: str) -> str:
    """String (JSON) a live worker refreshes every few seconds; it expires when the worker dies."""
    return f"{PREFIX}worker:{hostname}"


WORKER_HEARTBEAT_PATTERN = f"{PREFIX}worker:*"


def memory_kill(task_id: str) -> str:
    """String (JSON): the watchdog killed this task for memory (rss, limit, class, worker)."""
    return f"{PREFIX}memkill:{task_id}"


def delivery(task_id: str) -> str:
    """String (JSON): the delivery ledger's claim, which worker instance runs which attempt of a task."""
    return f"{PREFIX}delivery:{task_id}"


def bell(queue: str) -> str:
    """List of tokens, one per message published to ``queue`` (capped): idle workers block on it
    and then take the message itself atomically (see ``sluice/queues/broker/lua/fetch.lua``)."""
    return f"{PREFIX}bell:{queue}"


def tenant_lines(queue: str) -> str:
    """Set of the tenants that may have messages waiting on their own queues of class ``queue``
    (``sluice.tenants.tenant_queue``); the fetch script drops one whose queues it finds empty."""
    return f"{PREFIX}tenants:{queue}"


#: Hash: what held messages charge their tenants, ``<tag>`` -> ``<queue> <tenant> <millicores>
#: <bytes> <gpus>``, written and removed with the held message itself (``lua/held.lua``).
HELD_CHARGES = f"{PREFIX}held-charges"
#: Hash: each tenant's running compute on each class, ``<queue> <tenant> <axis>`` -> total (axis:
#: ``cpu`` millicores, ``memory`` bytes, ``gpu``), the sum of :data:`HELD_CHARGES` kept in the same steps.
TENANT_USAGE = f"{PREFIX}tenant-usage"


def parked(queue: str) -> str:
    """Sorted set: the lines of ``queue`` with messages parked on a rate limit, each member
    ``<tenant>\t<line>\t<limit id>`` -> when to look at it again (seconds, Redis's clock); the
    messages wait in the list named this key + ``\t`` + the member, oldest at the right, out of
    the way of the fetch until their limit's next start (``lua/fetch.lua``)."""
    return f"{PREFIX}parked:{queue}"


def parked_count(queue: str) -> str:
    """List of one token per message parked on a rate limit in ``queue``: its length is what
    KEDA's list trigger and kombu's queue size count of them."""
    return f"{PREFIX}parked-count:{queue}"


def dead_letters(queue: str) -> str:
    """List (newest first, capped) of messages from ``queue`` that could not be run, each
    ``<JSON header: reason, list, at>\n<the raw message>``."""
    return f"{PREFIX}dead:{queue}"


DEAD_LETTERS_PATTERN = f"{PREFIX}dead:*"

#: String: held (SET NX EX) by the one worker sweeping for orphaned messages right now.
REAPER_LOCK = f"{PREFIX}reaper:lock"


def attempts(task_id: str) -> str:
    """List of JSON records: each attempt of a task that ended without a result."""
    return f"{PREFIX}attempts:{task_id}"


def asset_value(run_id: str, asset: str) -> str:
    """Bytes: an asset's pickled value (or a file pointer) for one materialization run."""
    return f"{PREFIX}asset:{run_id}:{asset}"


def stat(name: str, resource_class: str) -> str:
    """Integer counter for metrics: ``escalations``, ``memory_kills`` or ``dead_letters`` of one class."""
    return f"{PREFIX}stats:{name}:{resource_class}"


class RunPart(StrEnum):
    """The keys of a batch run, ``run(run_id, part)``: every one a run may write."""

    SKIP = "skip"  #: set: ids dispatched
    RESULTS = "results"  #: hash: id -> record, the result cache
    READY = "ready"  #: list: records new to the driver
    SOURCE = "source"  #: hash: the task file, signed
    CANCEL = "cancel"  #: string: set on Ctrl-C
    FINISHED = "finished"  #: string: torchrun rank 0's exit code
    RANKS_LEFT = "ranks_left"  #: integer: torchrun ranks that have left


def run(run_id: str, part: RunPart) -> str:
    """One of a batch run's keys (:class:`RunPart`)."""
    return f"{PREFIX}run:{run_id}:{part}"


def remote_output(call_id: str) -> str:
    """List of lines: a remote call's installer and function output, streamed to its caller."""
    return f"{PREFIX}remote:{call_id}:output"


class SessionPart(StrEnum):
    """The keys of a remote session, ``session(session_id, part)``."""

    LEASE = "lease"  #: string with a TTL the client refreshes
    CALLS = "calls"  #: list: signed requests
    REPLIES = "replies"  #: list: signed replies, in call order


def session(session_id: str, part: SessionPart) -> str:
    """One of a remote session's keys (:class:`SessionPart`)."""
    return f"{PREFIX}session:{session_id}:{part}"


#: Hash: task name -> JSON entry of the task catalog (declared and effective compute, retry
#: policy, who published it when); written by every worker, read by senders and ``sluice explain``.
TASK_CATALOG = f"{PREFIX}tasks"

#: Hash: held message's delivery tag -> JSON list of the concurrency limits it counts against,
#: written and removed with the held message itself (``lua/held.lua``).
HELD_LIMITS = f"{PREFIX}held-limits"
#: Hash: a concurrency limit's id -> how many held messages count against it (``sluice.tasks.limits``),
#: kept in the same steps as :data:`HELD_LIMITS`.
LIMIT_RUNNING = f"{PREFIX}limit-running"

#: String per rate limit (this prefix + the limit's id): the earliest next start of a call under
#: it by its spacing, in microseconds of Redis's clock, expiring a spacing later; and this key +
#: "\tstarts": a list of its last N starts (``sluice.tasks.limits``, the fetch script).
LIMIT_NEXT_PREFIX = f"{PREFIX}limit-next:"
#: Sorted set: "<rate limit id>\t<seconds between starts>" -> when a call under it last started;
#: those not started for ten minutes are dropped (what ``sluice status`` and the metrics show).
LIMIT_RATES = f"{PREFIX}limit-rates"

#: Hash: task name -> JSON of the limits a call of it is held to when its message carries none
#: and no charge (a plain Celery producer's, or a send_task of a task the sender lacks the code
#: of): its task-wide limits, a keyed one under the task's id (``sluice.tasks.limits``); "[]"
#: for none. Written by every worker with the task catalog.
TASK_LIMITS = f"{PREFIX}task-limits"

#: Sorted set: task id -> until when its revoke is kept (seconds since the epoch): no worker
#: starts a task recorded here (``sluice.queues.revokes``; the fetch script flags it).
REVOKED = f"{PREFIX}revoked"


def unique_followers(task_id: str) -> str:
    """List: the ids of duplicates of unique call ``task_id`` (sent twice by a producer that made
    no claim) that get its outcome once it is stored (``sluice.tasks.unique.follow``)."""
    return f"{PREFIX}unique-followers:{task_id}"


def unique(task: str, key: str) -> str:
    """String: the task id that holds idempotency key ``key`` of ``task`` (with a TTL; ``sluice.tasks.unique``)."""
    return f"{PREFIX}unique:{task}:{key}"


#: Hash: ``"<from queue> <to queue>"`` -> how many messages workers forwarded between them.
FORWARDED = f"{PREFIX}stats:forwarded"


def memory_profile(task: str) -> str:
    """Hash: a task's observed peak memory as a log-scale histogram (field ``b<i>`` -> runs) and
    ``kills`` (memory kills). See ``sluice.tasks.memory_profile``."""
    return f"{PREFIX}profile:{task}"


#: Sorted set: task name -> the highest peak memory (bytes) any of its runs reached.
MEMORY_PEAKS = f"{PREFIX}profile-peaks"
