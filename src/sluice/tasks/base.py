"""ComputeTask: the Celery task base class that carries a task's compute and retry policy."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, NoReturn

from celery import Task, states
from celery.exceptions import Ignore, Retry

from sluice.compute import Compute
from sluice.errors import AttemptFailed, TaskFailed, WorkerLost
from sluice.headers import LIMITS, UNIQUE, attempt_of
from sluice.ids import new_id
from sluice.tasks import bulk, ledger, unique
from sluice.tasks.bulk import BulkResult
from sluice.tasks.call_keys import call_key, check_key
from sluice.tasks.escalation import Attempt, end_attempt
from sluice.tasks.limits import RATE_OPTION, RUNNING_OPTION, Limit, limits_header
from sluice.tasks.request import ComputeRequest
from sluice.tasks.retry import Reason, RetryPolicy, classify
from sluice.tasks.unique import Unique

log = logging.getLogger("sluice.task")
#: Where the result backend leaves the claim it made with the STARTED state, on the request:
#: a one-tuple holding the claim that one replaced (or None).
CLAIMED = "sluice_claimed"


def _unique_claim(request: Any) -> tuple[int, str] | None:
    """``(ttl, key)`` of a unique call's claim, from its :data:`~sluice.headers.UNIQUE` header."""
    value = getattr(request, UNIQUE, None)
    if not isinstance(value, str) or " " not in value:
        return None
    ttl, key = value.split(" ", 1)
    return (int(ttl), key) if ttl.isdigit() else None


class ComputeTask(Task):
    """Base of every task an :class:`sluice.App` declares.

    ``compute`` is the task's declared size (axes left unset inherit the app default) and
    ``retry_policy`` what happens when an attempt fails (``@app.task(retry=RetryPolicy(...))``).
    In the pool process, before the task runs, its attempt is claimed in the delivery ledger
    (a redelivery of an attempt whose worker died is ended by the policy, not blindly re-run);
    exceptions the task raises are handled here too. Pool processes that die are handled by
    ``Request`` (:class:`ComputeRequest`) in the worker's main process, and messages its class
    cannot hold by ``Strategy`` there (:mod:`sluice.workers.admission`).
    """

    compute: Compute | None = None
    retry_policy: RetryPolicy | None = None
    #: One run per idempotency key taken from the call's arguments (``@app.task(unique=Unique(...))``).
    unique: Unique | None = None
    #: At most this many running at once across the cluster (``@app.task(max_running=...)``).
    max_running: int | Limit | None = None
    #: ``@app.task(rate_limit=Limit(...))``, kept apart from Celery's ``rate_limit`` (see ``sluice.tasks.limits``).
    keyed_rate_limit: Limit | None = None
    #: Whether the stored state (``result_extended``) repeats the task's arguments; False for a task
    #: whose arguments are bulk data (``@app.task(result_args=False)``; a batch chunk's are).
    result_args: bool = True
    Request = ComputeRequest
    #: Celery's per-task message handler, behind admission (a task its class cannot hold is forwarded)
    Strategy = "sluice.workers.admission:strategy"
    _warned_eager: bool = False

    @property
    def cluster_limits(self) -> dict[str, Any]:
        """The limits the cluster holds this task's calls to (option -> value): ``max_running``,
        and ``rate_limit`` unless the ``rate_limit_per_worker`` setting leaves a plain rate to
        Celery (a keyed :class:`Limit` has no Celery meaning: the cluster always holds it)."""
        limits: dict[str, Any] = {}
        rate = self.keyed_rate_limit or self.rate_limit
        if rate is not None and (isinstance(rate, Limit) or not self.app.settings.rate_limit_per_worker):
            limits[RATE_OPTION] = rate
        if self.max_running is not None:
            limits[RUNNING_OPTION] = self.max_running
        return limits

    @property
    def effective_compute(self) -> Compute:
        """The declared compute with unset axes filled from the app's default compute."""
        return self.app.effective_compute(self.name)

    def delay_many(
        self,
        items: Iterable[Any],
        kwargs: dict[str, Any] | None = None,
        chunk: int | None = None,
        progress: bool | None = None,
        tenant: str | None = None,
    ) -> BulkResult:
        """One call per item (a tuple or list: its arguments; anything else: its one argument),
        published ``chunk`` (default 1000) at a time in one Redis round trip each; a lazy ``BulkResult`` back
        (``.get()`` in order, ``.as_completed()`` as they finish); ``tenant``: whose calls they
        are (see ``sluice.tenants``). See :mod:`sluice.tasks.bulk`."""
        return bulk.delay_many(self, items, kwargs=kwargs, chunk=chunk, progress=progress, tenant=tenant)

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any) -> Any:
        """Celery's, plus the call's limits in its headers (the task's ``rate_limit=`` and
        ``max_running=``, ``sluice.tasks.limits``) and ``idempotency_key=`` (or the task's
        ``unique=``): a call whose key is held already publishes nothing and returns the
        holder's result (``sluice.tasks.unique``)."""
        key = options.pop("idempotency_key", None)
        limits = self.cluster_limits
        if limits:
            header = limits_header(self.name, limits, self.run, args or (), kwargs or {})
            options["headers"] = {**(options.get("headers") or {}), LIMITS: header}
        if key is None and self.unique is not None:
            key = call_key(self.unique.key, self.run, args or (), kwargs or {}, unique.KEY)
        if key is None:
            return super().apply_async(args, kwargs, task_id, **options)
        key = check_key(key, self.name, unique.KEY)
        ttl = self.unique.ttl if self.unique is not None else unique.DEFAULT_TTL
        task_id = task_id or new_id()
        held = unique.claim(self.app.redis, self.name, key, task_id, ttl)
        if held is not None:
            return self.AsyncResult(held)
        headers = {**(options.pop("headers", None) or {}), UNIQUE: f"{ttl} {key}"}
        try:
            return super().apply_async(args, kwargs, task_id, headers=headers, **options)
        except BaseException:
            unique.give_back(self.app.redis, self.name, key, task_id)
            raise

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.is_eager or request.called_directly:
            self._warn_eager()
            return super().__call__(*args, **kwargs)
        self._claim_delivery(request)
        claim = _unique_claim(request) or self._declared_claim(args, kwargs)
        if claim is not None:  # it stands while the task runs, and ttl after it ends
            self._hold_unique(request, claim)
        try:
            return super().__call__(*args, **kwargs)
        except (Retry, Ignore, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            self._end_attempt(request, classify(exc), f"{type(exc).__name__}: {exc}", exc)  # always raises
        finally:
            if claim is not None:
                unique.renew(self.app.redis, self.name, claim[1], claim[0])

    def _declared_claim(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, str] | None:
        """A unique task's claim from its arguments, for a message that came without the header
        (a plain Celery producer's: it made no claim)."""
        if self.unique is None:
            return None
        return self.unique.ttl, call_key(self.unique.key, self.run, args, kwargs, unique.KEY)

    def _hold_unique(self, request: Any, claim: tuple[int, str]) -> None:
        """Hold the call's idempotency key while it runs. A sluice producer claimed it at
        publish; a message from one that did not (a plain Celery producer) claims it here, and
        if another call holds it this one is a duplicate: not run (acknowledged), its id made to
        resolve to the holder's result (``unique.follow``)."""
        ttl, key = claim
        holder = unique.claim(self.app.redis, self.name, key, request.id, ttl)
        if holder is None:  # claimed just now, for ttl
            return
        if holder != request.id:
            log.warning("task %s[%s] duplicates %s (idempotency key %r): not run", self.name, request.id, holder, key)
            unique.follow(self.app, holder, request.id, ttl)
            raise Ignore()
        unique.renew(self.app.redis, self.name, key, ttl)

    def after_return(self, status: str, retval: Any, task_id: str, *args: Any, **kwargs: Any) -> None:
        """Once a unique call's outcome is stored, the duplicates that follow it get it too."""
        request = self.request
        if status in states.READY_STATES and not request.is_eager and (_unique_claim(request) or self.unique):
            unique.resolve_followers(self.app, task_id)
        super().after_return(status, retval, task_id, *args, **kwargs)

    def delivery_claim(self, request: Any) -> ledger.ClaimWrite | None:
        """The ledger write that claims this attempt (None outside a worker)."""
        instance = self.app.worker_instance
        if instance is None:
            return None
        return ledger.ClaimWrite.of(
            request.id, attempt_of(request), self.app.node_name(request), instance, self.claim_ttl
        )

    @property
    def claim_ttl(self) -> int:
        """How long a ledger claim is kept: past any redelivery of the attempt it records."""
        return self.app.settings.visibility_timeout + 3600

    def _claim_delivery(self, request: Any) -> None:
        """Claim this attempt in the ledger; act on a redelivery of a dead attempt. The claim
        rode in the STARTED state's store when there was one (``request.sluice_claimed``, set by
        ``sluice.queues.broker.result_backend``), else it costs a round trip here."""
        claimed = getattr(request, CLAIMED, None)
        if claimed is None:
            write = self.delivery_claim(request)
            if write is None:
                return
            claimed = (ledger.claim(self.app.redis, write),)
        instance, number, ttl = self.app.worker_instance, attempt_of(request), self.claim_ttl
        previous = claimed[0]
        if previous is None:
            return
        # A message for a task that already ended (a redelivery, or a copy published twice under
        # one id) is not run again: its stored outcome stands, and the caller's .get() returns it.
        # One GET, only when the task was claimed before (retries and redeliveries). With rpc://
        # results nothing is stored for a worker to find, and the copy runs (as on Celery).
        if self.backend.get_state(request.id) in states.READY_STATES:
            log.warning(
                "task %s[%s] was delivered again after it finished; not running it again", self.name, request.id
            )
            raise Ignore()
        if previous.attempt != number or previous.instance == instance:
            return
        if ledger.holder_running(self.app.redis, request.id, previous):
            ledger.put_back(self.app.redis, request.id, previous, ttl)
            log.warning(
                "task %s[%s] delivered again while %s still runs it; dropping the duplicate",
                self.name,
                request.id,
                previous.worker,
            )
            raise Ignore()
        detail = f"worker {previous.worker} died while running attempt {number}"
        self._end_attempt(request, Reason.WORKER_LOST, detail, WorkerLost(f"task {self.name}[{request.id}]: {detail}"))

    def _end_attempt(self, request: Any, reason: Reason, detail: str, error: BaseException) -> NoReturn:
        """Raise what the policy decided: Retry (next attempt published) or the final error."""
        attempt = Attempt.of(self, request, request.delivery_info)
        if attempt.policy is None:
            raise error
        outcome: TaskFailed | None = end_attempt(self, request, attempt, reason, detail, self.app.node_name(request))
        if isinstance(outcome, AttemptFailed):
            raise Retry(str(outcome), exc=outcome) from error
        raise (outcome or error) from (error if outcome else None)

    def _warn_eager(self) -> None:
        """In-process runs have no per-task envelope: say so once per task, then run."""
        if (self.compute is not None or self.retry_policy is not None) and not type(self)._warned_eager:
            type(self)._warned_eager = True
            log.warning(
                "%s runs in-process (eager): its compute %s and retry policy are not enforced here; "
                "they apply on workers",
                self.name,
                self.effective_compute.describe(),
            )
