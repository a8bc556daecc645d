"""The core's settings, each declared once, and loading them with each capability's section.

Precedence, highest first:

1. arguments given to :class:`sluice.App` in code;
2. environment variables ``SLUICE_*``;
3. ``sluice.toml`` in the working directory (or the file named by ``SLUICE_CONFIG``);
4. ``[tool.sluice]`` in ``pyproject.toml`` in the working directory;
5. built-in defaults.

Resource classes from every layer are merged by name onto the default ladder (see
:meth:`sluice.queues.Catalog.merged`). A capability's settings are its own :class:`Section`,
declared the same way (:func:`~sluice.config.declare.setting`), read from the same layers and
flat keys (``remote_memory``, ``SLUICE_REMOTE_MEMORY``), and validated when the settings load.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import sluice
from sluice.compute import Compute
from sluice.config.declare import kinds, read, setting, shared
from sluice.config.sources import merged_layers
from sluice.config.up import embedded_state
from sluice.config.values import ClassTables, DefaultCompute, Flag, Memory, Number, PathValue, Text
from sluice.errors import ConfigurationError
from sluice.queues.catalog import Catalog
from sluice.tenants import DEFAULT_TENANT, check_tenant

#: The compute of a task that declares none, unless configured ("auto" memory falls back to it too).
BUILTIN_DEFAULT_COMPUTE = Compute(cpu="1", memory="512Mi")

#: Longer than any task should run: a task still running on a live worker must never be redelivered.
DEFAULT_VISIBILITY_TIMEOUT = 6 * 3600

S = TypeVar("S")
SectionT = TypeVar("SectionT", bound="Section")
_YEARS_10 = 10 * 365 * 86_400


class Section:
    """Base of a capability's settings section: a frozen dataclass whose settings are declared with
    :func:`~sluice.config.declare.setting`; a field that is not a setting is the core setting of
    the same name (e.g. ``home``)."""

    @classmethod
    def from_table(cls: type[SectionT], table: Mapping[str, Any], core: Settings) -> SectionT:
        """Read from the merged layers' raw values and check against the core settings; a bad
        value raises ConfigurationError naming it."""
        section = cls(**shared(cls, core), **read(cls, table))
        section.check(core)
        return section

    def check(self, core: Settings) -> None:
        """Checks against the core settings (a class name against the catalog); none by default."""


@dataclass(frozen=True)
class Settings:
    """Everything configurable, resolved once."""

    broker_url: str | None = setting(
        Text(),
        "Redis for broker, results and sluice's state (redis://, rediss://, "
        "unix:// or sentinel://); default: a running `sluice up`, else localhost",
        default=None,
    )
    result_backend: str | None = setting(Text(), "Celery result backend; default: the broker", default=None)
    default_compute: Compute = setting(
        DefaultCompute(BUILTIN_DEFAULT_COMPUTE),
        "The compute of a task that declares none",
        default=BUILTIN_DEFAULT_COMPUTE,
        keys=("default_cpu", "default_memory"),
    )
    visibility_timeout: int = setting(
        Number(1, _YEARS_10, whole=True),
        "Seconds before Redis redelivers a held message its worker no longer renews",
        default=DEFAULT_VISIBILITY_TIMEOUT,
    )
    watchdog_interval: float = setting(Number(0.005, 10.0), "How often the watchdog measures, in seconds", default=0.05)
    heartbeat_interval: float = setting(
        Number(0.1, 60.0),
        "A worker beats this often, in seconds; it is taken for dead after 5 missed beats",
        default=2.0,
    )
    reaper_interval: float = setting(
        Number(0.1, 3600.0), "How often a worker sweeps for messages held by dead workers, in seconds", default=5.0
    )
    orphan_grace: float = setting(
        Number(0.1, 86_400.0),
        "A held message with no ledger claim is an orphan only after this many seconds",
        default=60.0,
    )
    home: Path = setting(
        PathValue(),
        "Where `sluice up` keeps its state (Redis data, logs, up.json)",
        factory=lambda: Path.home() / ".sluice",
    )
    catalog: Catalog = setting(
        ClassTables(),
        "Resource classes, merged by name onto the default ladder",
        factory=lambda: Catalog.merged({}),
        keys=("classes",),
    )
    remote_secret: str | None = setting(
        Text(),
        "The secret shared by clients and workers that signs everything a "
        "worker runs or unpickles from Redis (remote calls and replies, asset steps "
        "and values, batch runs' task files; HMAC-SHA256); without it none of that "
        "is sent, run or unpickled (the name is historical)",
        default=None,
    )
    intake_queue: str = setting(
        Text(),
        "The queue every sluice worker also drains, forwarding each task to the "
        "class that fits it: Celery's default queue, for plain Celery clients; not a class",
        default="celery",
    )
    auto_min_runs: int = setting(
        Number(1, 1_000_000, whole=True),
        'memory="auto": runs observed before the learned size is used (until then, the default memory)',
        default=5,
    )
    auto_headroom: float = setting(
        Number(1.0, 100.0),
        'memory="auto": the learned size is the observed p95 times this, rounded up to a tidy size',
        default=1.3,
    )
    auto_floor: int = setting(Memory(), 'memory="auto": the smallest learned size', default=64 << 20)
    outage_wait: float = setting(
        Number(1.0, 3600.0),
        "How long a command waits out an unreachable Redis, in seconds, before it raises "
        "(publishing and storing results too); `sluice compute` exits 75 past it",
        default=120.0,
    )
    lost_check_interval: float = setting(
        Number(0.1, 3600.0),
        "How often a batch driver checks for lost chunks, in seconds: a chunk in no queue and "
        "no worker's hold on two checks this far apart is sent again",
        default=10.0,
    )
    run_ttl: float = setting(
        Number(1.0, float(_YEARS_10)),
        "Seconds a batch run's Redis data (and its directory, unless kept) outlive the run's end",
        default=3 * 86_400.0,
    )
    tenant: str = setting(
        Text(),
        "The tenant of a call that names none (`tenant=`, `with sluice.tenant(...)`): "
        "its weight and quota on each class are the class's `tenants` table's",
        default=DEFAULT_TENANT,
    )
    priority_max_wait: float = setting(
        Number(0.0, 86_400.0),
        "The longest a task sent with a priority waits behind higher priorities of its tenant "
        "on its class before it goes first (priority aging), in seconds; 0: no bound",
        default=300.0,
    )
    metrics_task_names: int = setting(
        Number(1, 100_000, whole=True),
        "The most task names `sluice metrics` exports task metrics for (a bound on its series); "
        'tasks past it are counted under name="other"',
        default=500,
    )
    rate_limit_per_worker: bool = setting(
        Flag(),
        "Give a task's rate_limit Celery's meaning: each worker process keeps the rate for itself "
        "(holding messages in its memory); default: the rate holds across the whole cluster",
        default=False,
    )
    sentinel_master: str | None = setting(
        Text(), "With a sentinel:// broker: the name the Sentinels monitor the master under", default=None
    )
    sentinel_password: str | None = setting(
        Text(), "With a sentinel:// broker: the Sentinels' own password (the URL's is the master's)", default=None
    )
    #: Each capability's section, by its class (see :meth:`section`).
    sections: Mapping[type, Any] = field(default_factory=dict)

    @classmethod
    def load(
        cls,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        sections: Iterable[type[Section]] | None = None,
    ) -> Settings:
        """Read every layer (see the module docstring) and validate the result. ``sections``:
        the capabilities' settings sections (default: those of ``sluice.default_capabilities()``)."""
        every = [c.settings for c in sluice.default_capabilities() if c.settings is not None]
        sections = tuple(every if sections is None else sections)
        others = [section for section in every if section not in sections]
        table = merged_layers(
            Path.cwd() if cwd is None else cwd,
            os.environ if env is None else env,
            kinds((cls, *sections)),
            declared=kinds(others),
        )
        core = cls(**read(cls, table))
        core.check()
        return replace(core, sections={section: section.from_table(table, core) for section in sections})

    def check(self) -> None:
        """The intake queue is a queue name that is not one of the resource classes; the tenant is a tenant name."""
        check_tenant(self.tenant)
        name = self.intake_queue
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum() or name in self.catalog:
            raise ConfigurationError(
                f"setting intake_queue={name!r} must be a queue name (letters, digits, '-', "
                f"'_', '.') that is not a resource class ({', '.join(self.catalog.names)})"
            )

    def signing_secret(self) -> str | None:
        """The signing secret: configured, or the one of a ``sluice up`` running here."""
        state = embedded_state(self.home)
        return self.remote_secret or (state.remote_secret if state else None) or None

    def section(self, kind: type[S]) -> S:
        """A capability's settings section; one its capability did not load is an error."""
        try:
            return self.sections[kind]
        except KeyError:
            raise ConfigurationError(
                f"settings were loaded without the {kind.__name__} section; load them with "
                "the capability that reads it installed"
            ) from None


def fallback_memory(default: Compute, settings: Settings) -> int:
    """The memory "auto" runs with until learned: ``default``'s, the settings', else the built-in."""
    return next(c.memory_bytes for c in (default, settings.default_compute, BUILTIN_DEFAULT_COMPUTE) if c.memory_bytes)
