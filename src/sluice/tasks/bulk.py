"""``task.delay_many(items)``: many calls of one task, published in pipelined chunks.

A ``.delay()`` loop pays, per call, a Redis round trip for the message, another for Flower's
task-sent event, and Celery's and kombu's per-publish bookkeeping. Here the task is routed
once and its message encoded once (a template each call fills with its id and arguments),
each chunk's messages reach Redis in one pipeline (kombu's publish batch, the queue's bell
rung once) and its task-sent events in one buffered event message (Celery's ``task.multi``,
which Flower reads). The messages are those ``apply_async`` builds (Celery's
``create_task_message``), so everything on the worker side (admission, the retry policy,
escalation, the ledger) is the same.

Why not Celery's ``task.map``/``task.chunks``: those build one task that runs every call in a
single worker; here every call is its own task, routed, retried and escalated on its own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sized
from contextlib import contextmanager
from itertools import islice
from typing import TYPE_CHECKING, Any

from celery import signals, states
from celery.result import AsyncResult, EagerResult, ResultSet
from celery.utils.saferepr import saferepr
from rich.progress import Progress
from vine import barrier

from sluice import terminal
from sluice.errors import ConfigurationError, SubmitInterrupted
from sluice.ids import new_id
from sluice.queues.broker.publishing import MessageTemplate, delivery_mode, serialize

if TYPE_CHECKING:
    from celery import Task

#: Calls per pipeline: large enough that a round trip is shared by many, small enough that one
#: chunk's messages (a few hundred bytes each) are a modest write.
DEFAULT_CHUNK = 1000


class BulkResult(ResultSet):
    """The calls of one ``delay_many``, in submission order: Celery's ``ResultSet`` (``get()``,
    ``join()``, ``ready()``, ``completed_count()``, ``revoke()``), plus :meth:`as_completed` and
    :attr:`ids`.

    Lazy twice over. Its ``AsyncResult`` objects are made when first asked for (``results``,
    any wait): a submit of ids only, a tenth of its time saved. And where Celery's set subscribes
    to every result's channel as it is built (its ready barrier: one Redis command per call),
    this one subscribes when it is waited on, as ``get()`` and ``as_completed()`` do, so it
    offers no ``then()`` callback."""

    _armed = False
    _results: list[AsyncResult] | None  #: made when first asked for (see ``results``)

    def __init__(self, ids: list[str], app: Any = None, results: list[AsyncResult] | None = None) -> None:
        """``results``: the calls' result objects when they were made anyway (``apply_async``'s,
        whose ``EagerResult`` in eager mode is the only place an eager call's value is kept)."""
        self._ids = ids
        super().__init__(None, app=app, ready_barrier=barrier())
        self._results = results

    @property
    def results(self) -> list[AsyncResult]:
        if self._results is None:
            self._results = [self.app.AsyncResult(task_id) for task_id in self._ids]
        return self._results

    @results.setter
    def results(self, results: list[AsyncResult] | None) -> None:
        self._results = results

    @property
    def ids(self) -> list[str]:
        """The calls' task ids, in submission order (no result objects made)."""
        return self._ids if self._results is None else [result.id for result in self._results]

    def __len__(self) -> int:
        return len(self._ids) if self._results is None else len(self._results)

    def iter_native(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """Celery's, with the ready barrier (and so the subscriptions) made when first waited on.
        A result that finished before is read from its stored state as the wait starts. Eager
        calls (``task_always_eager``) have ended already and store nothing: their values are
        their ``EagerResult``'s."""
        if self.results and all(isinstance(result, EagerResult) for result in self.results):
            return iter([(result.id, result._get_task_meta()) for result in self.results])
        if not self._armed:
            self._set_ready_barrier(barrier(self.results))
            self._armed = True
        return super().iter_native(*args, **kwargs)

    def as_completed(
        self, timeout: float | None = None, propagate: bool = True, progress: bool | None = None
    ) -> Iterator[tuple[int, Any]]:
        """``(index, value)`` of each call as it finishes (``index``: its place in the items),
        with a progress bar on a terminal. A failed call raises its exception when ``propagate``
        (else its exception is the value); ``timeout`` bounds the whole wait (Celery's
        ``TimeoutError``)."""
        index = {result.id: i for i, result in enumerate(self.results)}
        with _progress(progress, "done", len(self.results)) as advance:
            for task_id, meta in self.iter_native(timeout=timeout):
                value = meta["result"]
                if propagate and meta["status"] in states.PROPAGATE_STATES:
                    raise value
                advance(1)
                yield index[task_id], value


def delay_many(
    task: Task,
    items: Iterable[Any],
    kwargs: dict[str, Any] | None = None,
    chunk: int | None = None,
    progress: bool | None = None,
    tenant: str | None = None,
) -> BulkResult:
    """Publish one call of ``task`` per item: a tuple or list item is the call's positional
    arguments, anything else its one argument; ``kwargs`` go to every call; ``tenant``: whose
    calls they are (``sluice.tenants``; else as ``apply_async`` finds it). Returns at once
    with a :class:`BulkResult`. If publishing stops midway (Redis lost, an argument that does
    not serialize), :class:`SubmitInterrupted` says how many calls went out and holds them."""
    chunk = DEFAULT_CHUNK if chunk is None else chunk
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ConfigurationError(f"chunk={chunk!r}: the calls per pipeline must be a positive int, e.g. 1000")
    calls = (tuple(item) if isinstance(item, (tuple, list)) else (item,) for item in items)
    total = len(items) if isinstance(items, Sized) else None
    app = task.app
    options = {} if tenant is None else {"tenant": tenant}
    route = app.amqp.router.route(dict(options), task.name, (), {}, task)
    if _needs_apply_async(task, route["queue"]):
        with _progress(progress, "submitted", total) as advance:
            sent = [_advanced(advance, task.apply_async(args, kwargs, **options)) for args in calls]
        return BulkResult([result.id for result in sent], app=app, results=sent)
    published: list[str] = []
    with app.producer_or_acquire() as producer, _progress(progress, "submitted", total) as advance:
        publisher = _ChunkPublisher(task, producer, route, kwargs or {})
        try:
            while batch := list(islice(calls, chunk)):
                published += publisher.publish(batch, published)
                advance(len(batch))
        finally:
            publisher.events.close()
    return BulkResult(published, app=app)


class _ChunkPublisher:
    """Builds and pipelines one chunk's messages. The task is routed once, and Celery builds one
    message (``create_task_message``, protocol 2) that kombu encodes once as a template
    (:class:`~sluice.queues.broker.publishing.MessageTemplate`) with slots for the fields protocol 2 makes per
    call (``id``, ``root_id``, ``argsrepr``, the ``correlation_id`` property, the body's args).
    A test holds a message from it equal to ``apply_async``'s. The chunk's task-sent events go
    out after its messages, in one buffered event message."""

    def __init__(self, task: Task, producer: Any, route: dict[str, Any], kwargs: dict[str, Any]) -> None:
        self.task, self.app, self.channel = task, task.app, producer.channel
        self.queue = getattr(route["queue"], "name", route["queue"])
        self.serializer = task.serializer or self.app.conf.task_serializer
        self.events = self.app.events.Dispatcher(producer.connection, enabled=self.app.conf.task_send_sent_event)
        worker_task = self.app.current_worker_task
        request = worker_task.request if worker_task else None
        self.root_id = (request.root_id or request.id) if request else None
        built = self.app.amqp.create_task_message(
            "",
            task.name,
            (),
            kwargs,
            reply_to=self.app.thread_oid,
            root_id=self.root_id,
            parent_id=request.id if request else None,
            ignore_result=task.ignore_result,
            create_sent_event=self.events.enabled,
        )
        self.sent_event = built.sent_event and {
            **built.sent_event,
            "queue": self.queue,
            "exchange": "",
            "routing_key": self.queue,
        }
        self.kwargs, self.embed = kwargs, built.body[2]
        self.repr_size, self.repr_levels = self.app.amqp.argsrepr_maxsize, self.app.conf.task_repr_maxlevels
        self.encoder = MessageTemplate(self.channel, self.queue)
        slot = self.encoder.slot
        content_type, content_encoding, _ = serialize(((), kwargs, self.embed), self.serializer)
        headers = {
            **built.headers,
            **(route.get("headers") or {}),
            "id": slot("id"),
            "root_id": self.root_id or slot("id"),
            "argsrepr": slot("argsrepr"),
        }
        # the delivery mode Celery's send_task_message picks and kombu's Producer writes
        mode = getattr(getattr(route["queue"], "exchange", None), "delivery_mode", None)
        properties = {
            **built.properties,
            "correlation_id": slot("id"),
            "delivery_mode": delivery_mode(mode or self.app.conf.task_default_delivery_mode),
        }
        self.encoder.compile(self.channel.prepare_message("", 0, content_type, content_encoding, headers, properties))

    def publish(self, calls: list[tuple[Any, ...]], published: list[str]) -> list[str]:
        ids: list[str] = []
        sent: list[dict[str, Any]] = []
        batch = self.channel.create_publish_batch(max_size=sys.maxsize)
        flushing = False
        try:
            for args in calls:
                ids.append(self._add(batch, args, sent))
            flushing = True
            batch.flush()
            if self.sent_event:
                self.events.send_buffered("task-sent", self.sent_event, sent)
                self.events.flush(errors=False)
        except Exception as exc:
            uncertain = ids if flushing else []
            if not flushing:
                batch.discard()
            raise SubmitInterrupted(
                f"delay_many({self.task.name}) stopped after {len(published)} published calls "
                f"({len(uncertain)} more may have been): {exc!r}",
                published=BulkResult(published, app=self.app),
                uncertain=BulkResult(uncertain, app=self.app),
            ) from exc
        finally:
            batch.close()
        return ids

    def _add(self, batch: Any, args: tuple[Any, ...], sent: list[dict[str, Any]]) -> str:
        task_id = new_id()
        argsrepr = args_repr(args, self.repr_size, self.repr_levels)
        _, _, data = serialize((args, self.kwargs, self.embed), self.serializer)
        batch.push(self.encoder.key, self.queue, self.encoder.encode(data, id=task_id, argsrepr=argsrepr))
        if self.sent_event:
            sent.append({"uuid": task_id, "root_id": self.root_id or task_id, "args": argsrepr})
        return task_id


#: Argument types whose ``repr`` in a tuple is exactly Celery's ``saferepr`` of them.
_PLAIN = frozenset({int, float, bool, type(None)})


def args_repr(args: tuple[Any, ...], maxlen: int | None, maxlevels: int) -> str:
    """Celery's ``saferepr(args)`` (the ``argsrepr`` header Flower shows), by the builtin ``repr``
    where the two agree: a tuple of numbers, None and strings of printable ASCII without quotes
    or backslashes, shorter than ``maxlen``. saferepr walks tokens in Python, a twentieth of a
    bulk submit; a test holds the two equal."""
    if type(args) is tuple and all(type(a) in _PLAIN or (type(a) is str and _plain_text(a)) for a in args):
        text = repr(args)
        if maxlen is None or len(text) < maxlen:
            return text
    return saferepr(args, maxlen, maxlevels=maxlevels)


def _plain_text(text: str) -> bool:
    return text.isascii() and text.isprintable() and "'" not in text and "\\" not in text


def _needs_apply_async(task: Task, queue: Any) -> bool:
    """Where the pipelined path would not build what ``apply_async`` does: eager mode, publish
    signal receivers (they see each message), compression, a queue that expires (kombu sends
    more commands for it), a unique task (each call claims its idempotency key) or one the cluster
    limits (each call carries its own limits)."""
    conf = task.app.conf
    return bool(
        conf.task_always_eager
        or getattr(task, "unique", None) is not None
        or bool(getattr(task, "cluster_limits", None))
        or signals.before_task_publish.receivers
        or signals.after_task_publish.receivers
        or getattr(task, "compression", None)
        or conf.task_compression
        or getattr(queue, "expires", None)
    )


def _advanced(advance: Any, result: AsyncResult) -> AsyncResult:
    advance(1)
    return result


@contextmanager
def _progress(show: bool | None, what: str, total: int | None) -> Iterator[Any]:
    """A rich progress bar on stderr when it is a terminal (or ``show``); yields ``advance(n)``."""
    if not (sys.stderr.isatty() if show is None else show):
        yield lambda n: None
        return
    with Progress(console=terminal.console(stderr=True), transient=False) as bar:
        task_bar = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task_bar, n)
