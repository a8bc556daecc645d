"""App: a ``celery.Celery`` that routes each task by the compute it declares."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import click
import redis
from celery import Celery, Task

import sluice
from sluice import redis_client
from sluice.compute import Compute
from sluice.config import Settings, embedded_broker_url, fallback_memory
from sluice.errors import ConfigurationError
from sluice.queues.broker import fetching, leases, result_backend, transport
from sluice.queues.catalog import Catalog, ResourceClass
from sluice.queues.routing import ComputeRouter
from sluice.queues.task_catalog import TaskDirectory
from sluice.tasks import memory_profile
from sluice.tasks.base import ComputeTask
from sluice.tasks.call_keys import check_argument
from sluice.tasks.limits import KEYED_RATE_OPTION, RATE_OPTION, RUNNING_OPTION, Limit, check_limit
from sluice.tasks.memory_profile import ProfileCache
from sluice.tasks.retry import RetryPolicy
from sluice.tasks.unique import Unique
from sluice.tenants import check_tenant
from sluice.workers.bootstep import SluiceWorkerStep

if TYPE_CHECKING:
    from sluice.capability import Capability

REDIS_SCHEMES = ("redis", "rediss", "unix", redis_client.SENTINEL_SCHEME)
#: Where an app points when nothing is configured and no ``sluice up`` is running.
FALLBACK_BROKER = "redis://127.0.0.1:6379/0"


def safe_defaults(
    settings: Settings, catalog: Catalog, broker: str = FALLBACK_BROKER, backend: str = FALLBACK_BROKER
) -> dict[str, Any]:
    """Celery settings chosen for long, memory-hungry tasks (each one explained in the README).

    * ``task_acks_late`` + prefetch 1: a message is acknowledged only once its task has ended,
      and a worker holds no more than it is running.
    * JSON only: nothing on a task queue executes code when it is decoded.
    * visibility timeout: longer than any task should run, so a live worker's task is never
      handed to a second worker.
    * sent events: Flower sees each attempt's queue (an escalated retry is a new publish).
    * worker_direct: every worker also consumes its own queue, so a retry can go back to the
      same worker and a remote call to the worker that holds its package environment.
    * publishing and storing results wait out a Redis outage (``sluice.redis_client``).
    * the ``sluice`` transport (``sluice.queues.broker.transport``): reliable fetch, dead letters, leases;
      and a consumer that keeps every message Celery cannot run as a dead letter. Its fetch
      shares each class between tenants by the class's slot and tenant shares, which travel in
      its transport options.
    """
    sentinel = (
        {
            "master_name": redis_client.require_master_name(url, settings),
            "sentinel_kwargs": redis_client.sentinel_kwargs(settings),
        }
        for url in (broker, backend)
        if redis_client.is_sentinel(url)
    )
    sentinel_options = next(sentinel, {})
    return {
        "broker_transport": transport.alias_for(broker),
        "worker_consumer": "sluice.workers.consumer:SluiceConsumer",
        "task_acks_late": True,
        "worker_prefetch_multiplier": 1,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout,
            leases.LEASE_OPTION: leases.lease_interval(settings.visibility_timeout, settings.orphan_grace),
            fetching.SHARES_OPTION: {rc.name: rc.fetch_terms() for rc in catalog},
            fetching.PRIORITY_WAIT_OPTION: settings.priority_max_wait,
            **(sentinel_options if redis_client.is_sentinel(broker) else {}),
        },
        "result_backend_transport_options": sentinel_options if redis_client.is_sentinel(backend) else {},
        "result_extended": True,
        "task_track_started": True,
        "task_send_sent_event": True,
        "task_default_queue": catalog.default_class.name,
        "broker_connection_retry_on_startup": True,
        "worker_direct": True,
        **redis_client.retry_settings(settings.outage_wait),
    }


#: Options ``@app.task`` accepts besides Celery's own and those the installed capabilities declare.
CORE_TASK_OPTIONS = ("compute", "retry", "unique", "max_running")
#: Celery task options read from the task class by name, not declared on ``celery.Task`` itself.
_CELERY_EXTRA_OPTIONS = (
    "shared",
    "lazy",
    "filter",
    "autoretry_for",
    "dont_autoretry_for",
    "retry_kwargs",
    "retry_backoff",
    "retry_backoff_max",
    "retry_jitter",
    "queue",
    "routing_key",
    "exchange",
    "exchange_type",
    "compression",
    "store_eager_result",
    "backend",
)


@functools.cache
def celery_task_options() -> tuple[str, ...]:
    """Every option Celery's ``@app.task`` accepts: its keywords and the ``Task`` class's settings."""
    keywords = [n for n in inspect.signature(Celery._task_from_fun).parameters if n not in ("self", "fun", "options")]
    attributes = [
        n
        for cls in Task.__mro__
        for n, v in vars(cls).items()  # vars: no deprecated getter runs
        if not n.startswith("_")
        and not callable(v)
        and not isinstance(v, (property, classmethod, staticmethod))
        and n not in ("app", "request_stack")
    ]
    return tuple(sorted({*keywords, *attributes, *_CELERY_EXTRA_OPTIONS, "Request", "Strategy"}))


class App(Celery):
    """A Celery app whose tasks declare compute and are routed to the smallest class that fits.

    ``App("myapp")`` reads :class:`sluice.Settings` (env, sluice.toml, pyproject); arguments
    given here win over them. ``classes=`` replaces the configured catalog outright.
    ``capabilities=`` picks what the app can do besides plain tasks (default:
    ``sluice.default_capabilities()``: batch runs, remote functions, assets).
    """

    #: Celery's events with sluice's dispatcher (``sluice.events``: the task-sent event costs less).
    events_cls = "sluice.events:Events"
    #: Celery's messaging with a connection whose URI names its Redis scheme (Flower reads it).
    amqp_cls = "sluice.queues.broker.amqp:SluiceAMQP"
    #: Celery's remote control, recording revoked task ids in Redis (``sluice.queues.revokes``).
    control_cls = "sluice.queues.revokes:SluiceControl"

    def __init__(
        self,
        main: str | None = None,
        *,
        default_compute: Compute | None = None,
        classes: Iterable[ResourceClass] | None = None,
        settings: Settings | None = None,
        broker: str | None = None,
        backend: str | None = None,
        capabilities: Iterable[Capability] | None = None,
        tenant: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.capabilities: tuple[Capability, ...] = tuple(
            sluice.default_capabilities() if capabilities is None else capabilities
        )
        settings = settings or Settings.load(sections=[c.settings for c in self.capabilities if c.settings])
        if default_compute is not None and not isinstance(default_compute, Compute):
            raise ConfigurationError(f"default_compute={default_compute!r} must be a sluice.Compute")
        self.settings = settings
        self.default_compute = (default_compute or Compute()).inherit(settings.default_compute)
        #: The tenant of this App's calls that name none (``sluice.tenants``).
        self.default_tenant = check_tenant(settings.tenant if tenant is None else tenant)
        self.catalog = Catalog(classes) if classes is not None else settings.catalog
        self.catalog.route(self.unlearned(self.default_compute), "the app's default compute")
        broker = broker or settings.broker_url or embedded_broker_url(settings.home) or FALLBACK_BROKER
        _check_redis_url(broker)
        super().__init__(
            main, broker=broker, backend=backend or settings.result_backend or broker, task_cls=ComputeTask, **kwargs
        )
        self.loader.override_backends = {**self.loader.override_backends, **result_backend.PATHS}
        self.conf.update(safe_defaults(settings, self.catalog, broker, backend or settings.result_backend or broker))
        self.conf.task_routes = (ComputeRouter(self),)
        self.steps["worker"].add(SluiceWorkerStep)
        self.user_options["worker"].add(
            click.Option(
                ["--allow-no-gpu"],
                is_flag=True,
                default=False,
                help="Let this worker consume gpu classes on a machine without a GPU (development only).",
            )
        )
        for capability in self.capabilities:
            capability.install(self)

    @classmethod
    @functools.cache
    def default(cls) -> App:
        """The one app sluice uses when none is given (remote functions, assets on workers, the
        batch runner's local workers): every default capability, settings from the environment."""
        return cls("sluice")

    #: Set by the worker bootstep: this worker process's unique instance id (None outside workers).
    worker_instance: str | None = None
    #: Set by the worker bootstep: the worker's node name (``-n``), inherited by its pool processes.
    worker_node: str | None = None

    def node_name(self, request: Any) -> str:
        """The name of the worker running ``request``: the one its heartbeat, direct queue and
        ledger claims go by. Not ``request.hostname``: in the pool processes of a worker Celery's
        testing helpers start (``start_worker``, the ``celery_worker`` fixture) that is the machine's
        hostname, since only ``celery worker`` hands the node name to the pool."""
        return self.worker_node or request.hostname or "?"

    def task(self, *args: Any, **opts: Any) -> Any:
        """Celery's ``@app.task``, plus ``compute=``, ``retry=``, ``unique=``, ``max_running=`` and
        ``rate_limit=Limit(...)``, checked here at decoration time: an unknown option, a compute no
        class holds, a policy whose max_memory no class holds or a bad limit fails at import."""
        self._check_options(opts, args[0] if args and callable(args[0]) else None)
        if "retry" in opts:
            opts["retry_policy"] = opts.pop("retry")
        if isinstance(opts.get(RATE_OPTION), Limit):  # not Celery's rate_limit: its code reads that as a rate
            opts[KEYED_RATE_OPTION] = opts.pop(RATE_OPTION)
        if args and callable(args[0]):
            self._check_task(args[0], opts)
            return super().task(*args, **opts)
        return functools.partial(self._checked_task, opts)

    def _check_options(self, opts: dict[str, Any], fun: Any) -> None:
        own = (*CORE_TASK_OPTIONS, *(o for capability in self.capabilities for o in capability.accepted_task_options))
        unknown = sorted(set(opts) - {*own, *celery_task_options(), "retry_policy"})
        if unknown:
            where = f"{_task_name(fun, opts)}: " if fun is not None else ""
            raise ConfigurationError(
                f"{where}unknown task option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                f"sluice accepts {', '.join(own)} and Celery's own: {', '.join(celery_task_options())}"
            )

    def _checked_task(self, opts: dict[str, Any], fun: Any) -> Any:
        self._check_task(fun, opts)
        return super().task(**opts)(fun)

    def _check_task(self, fun: Any, opts: dict[str, Any]) -> None:
        compute, policy, name = opts.get("compute"), opts.get("retry_policy"), _task_name(fun, opts)
        if compute is not None and not isinstance(compute, Compute):
            raise ConfigurationError(
                f"{name}: compute={compute!r} must be a sluice.Compute, e.g. Compute(memory='8Gi')"
            )
        if policy is not None and not isinstance(policy, RetryPolicy):
            raise ConfigurationError(f"{name}: retry={policy!r} must be a sluice.RetryPolicy")
        unique = opts.get("unique")
        if unique is not None:
            if not isinstance(unique, Unique):
                raise ConfigurationError(
                    f'{name}: unique={unique!r} must be a sluice.Unique, e.g. Unique(key="order_id")'
                )
            check_argument(unique.key, fun, name, bool(opts.get("bind")), "Unique")
        for given, option in ((RATE_OPTION, RATE_OPTION), (KEYED_RATE_OPTION, RATE_OPTION), (RUNNING_OPTION,) * 2):
            if opts.get(given) is not None:
                check_limit(option, opts[given], fun, name, bool(opts.get("bind")))
        effective = self.unlearned((compute or Compute()).inherit(self.default_compute))
        self.catalog.route(effective, name)
        if policy is not None:
            policy.check(effective, self.catalog, name)

    def inherited_compute(self, task_name: str) -> Compute:
        """A task's declared axes over the app's default compute (memory may still be "auto")."""
        task = self.tasks.get(task_name)
        declared = getattr(task, "compute", None) or Compute()
        return declared.inherit(self.default_compute)

    def effective_compute(self, task_name: str) -> Compute:
        """The compute a task runs with: its declared axes over the app's default compute, with
        ``memory="auto"`` resolved from the task's observed runs (see :meth:`resolve`)."""
        return self.resolve(task_name, self.inherited_compute(task_name))

    def resolve(self, task_name: str, compute: Compute, fallback: int | None = None) -> Compute:
        """``compute`` with "auto" memory replaced by the size learned from ``task_name``'s runs
        (``sluice.tasks.memory_profile``), or until it has enough of them ``fallback`` (a task
        catalog entry's: its own app's default memory), else this app's default memory."""
        if not compute.auto_memory:
            return compute
        return memory_profile.with_learned_memory(
            compute, self.memory_profiles.get(task_name), self.settings, fallback or self.fallback_memory
        )

    def unlearned(self, compute: Compute) -> Compute:
        """``compute`` with "auto" memory replaced by the default memory (no observations used)."""
        return compute.replace(memory_bytes=self.fallback_memory) if compute.auto_memory else compute

    @property
    def fallback_memory(self) -> int:
        """What "auto" memory runs with until it is learned: the app's default memory, else the
        configured one, else the built-in 512Mi."""
        return fallback_memory(self.default_compute, self.settings)

    def memory_profile(self, task_name: str) -> memory_profile.MemoryProfile:
        """What the workers observed of a task's memory: runs, p50, p95 and peak (bytes), kills."""
        return memory_profile.read(self.redis, task_name)

    @functools.cached_property
    def memory_profiles(self) -> ProfileCache:
        """Observed memory, cached here: resolves ``memory="auto"`` without a round trip per task."""
        return memory_profile.ProfileCache(lambda: self.redis)

    def route(self, task_name: str) -> ResourceClass:
        """The resource class a task is routed to."""
        return self.catalog.route(self.effective_compute(task_name), task_name)

    @functools.cached_property
    def task_directory(self) -> TaskDirectory:
        """The cluster's task catalog, cached here: routes tasks this process has not imported."""
        return TaskDirectory(lambda: self.redis)

    @functools.cached_property
    def redis(self) -> redis.Redis:
        """A redis-py client on the broker's Redis (sluice keeps its own state there too)."""
        return redis_client.connect(self.conf.broker_url, settings=self.settings)


def _task_name(fun: Any, opts: dict[str, Any]) -> str:
    return opts.get("name") or f"{fun.__module__}.{fun.__qualname__}"


def _check_redis_url(url: str) -> None:
    if urlparse(url).scheme not in REDIS_SCHEMES:
        raise ConfigurationError(
            f"broker {url!r} is not a Redis URL; sluice keeps its state in Redis, use redis://, rediss://, unix:// "
            "or sentinel://host:26379;sentinel://host2:26379 (with sentinel_master set)"
        )
    if redis_client.is_sentinel(url):
        redis_client.sentinel_nodes(url)
