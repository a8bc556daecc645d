"""Settings: one frozen object read from env ``SLUICE_*`` over ``sluice.toml`` over pyproject.

Precedence, highest first:

1. arguments given to :class:`sluice.App` in code;
2. environment variables ``SLUICE_*``;
3. ``sluice.toml`` in the working directory (or the file named by ``SLUICE_CONFIG``);
4. ``[tool.sluice]`` in ``pyproject.toml`` in the working directory;
5. built-in defaults.

Resource classes from every layer are merged by name onto the default ladder (see
:meth:`sluice.queues.Catalog.merged`). A capability's settings are its own :class:`Section`,
read from the same layers and flat keys (``remote_memory``, ``SLUICE_REMOTE_MEMORY``), and
validated when the settings are loaded.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from sluice.compute import Compute
from sluice.errors import ConfigurationError
from sluice.queues.catalog import CLASS_KEYS, Catalog
from sluice.units import parse_memory, real_number

log = logging.getLogger("sluice.config")

SETTING_KEYS = ("broker_url", "result_backend", "default_cpu", "default_memory", "visibility_timeout",
                "watchdog_interval", "heartbeat_interval", "reaper_interval", "orphan_grace", "home", "classes", "remote_secret",
                "intake_queue", "auto_min_runs", "auto_headroom", "auto_floor", "run_ttl", "sentinel_master",
                "sentinel_password")

#: The compute of a task that declares none, unless configured ("auto" memory falls back to it too).
BUILTIN_DEFAULT_COMPUTE = Compute(cpu="1", memory="512Mi")

#: Longer than any task should run: a task still running on a live worker must never be redelivered.
DEFAULT_VISIBILITY_TIMEOUT = 6 * 3600


class Section(Protocol):
    """A capability's settings: a frozen dataclass built from the merged layers' table."""

    #: The flat setting keys this section reads (env: ``SLUICE_<KEY>``).
    KEYS: ClassVar[tuple[str, ...]]

    @classmethod
    def from_table(cls, table: Mapping[str, Any], home: Path, catalog: Catalog) -> Section:
        """Validate and build; a bad value raises ConfigurationError naming it."""
        ...


S = TypeVar("S")


@dataclass(frozen=True)
class Settings:
    """Everything configurable, resolved once."""

    broker_url: str | None = None
    result_backend: str | None = None
    default_compute: Compute = BUILTIN_DEFAULT_COMPUTE
    visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT
    watchdog_interval: float = 0.05
    #: A worker beats this often; it is taken for dead after 5 missed beats.
    heartbeat_interval: float = 2.0
    #: How often a worker sweeps for messages held by dead workers.
    reaper_interval: float = 5.0
    #: A held message with no ledger claim is an orphan only after this many seconds.
    orphan_grace: float = 60.0
    home: Path = field(default_factory=lambda: Path.home() / ".sluice")
    catalog: Catalog = field(default_factory=lambda: Catalog.merged({}))
    #: The secret shared by clients and workers that signs everything a worker runs or unpickles
    #: from Redis (remote calls and replies, asset steps and values, batch runs' task files;
    #: HMAC-SHA256). Without it none of that is sent, run or unpickled. The name is historical:
    #: remote calls were the first to be signed.
    remote_secret: str | None = None
    #: The queue every sluice worker also drains, forwarding each task to the class that fits it:
    #: Celery's own default queue, so a plain Celery client with its defaults reaches sluice.
    intake_queue: str = "celery"
    #: ``memory="auto"``: runs observed before the learned size is used (until then, the default memory)
    auto_min_runs: int = 5
    #: ``memory="auto"``: the learned size is the observed p95 times this, rounded up to a tidy size
    auto_headroom: float = 1.3
    #: ``memory="auto"``: the smallest learned size, in bytes
    auto_floor: int = 64 << 20
    #: Seconds a batch run's Redis data (and its directory, unless kept) outlive the run's end.
    run_ttl: float = 3 * 86_400.0
    #: With a ``sentinel://`` broker: the name the Sentinels monitor the master under.
    sentinel_master: str | None = None
    #: With a ``sentinel://`` broker: the Sentinels' own password (the URL's is the master's).
    sentinel_password: str | None = None
    #: Each capability's section, by its class (see :meth:`section`).
    sections: Mapping[type, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, cwd: Path | None = None, env: Mapping[str, str] | None = None,
             sections: Iterable[type[Section]] | None = None) -> Settings:
        """Read every layer (see the module docstring) and validate the result. ``sections``:
        the capabilities' settings sections (default: those of ``sluice.default_capabilities()``)."""
        if sections is None:
            import sluice  # the package, for its one list of default capabilities

            sections = [c.settings for c in sluice.default_capabilities() if c.settings is not None]
        sections = tuple(sections)
        accepted = SETTING_KEYS + tuple(key for section in sections for key in section.KEYS)
        env = os.environ if env is None else env
        cwd = Path.cwd() if cwd is None else cwd
        layers = [_pyproject_table(cwd / "pyproject.toml"), _toml_file(_config_path(cwd, env)), _env_table(env, accepted)]
        merged: dict[str, Any] = {}
        classes: dict[str, dict[str, Any]] = {}
        for layer in layers:
            unknown = set(layer) - set(accepted)
            if unknown:
                raise ConfigurationError(f"unknown sluice settings {sorted(unknown)}; accepted: {', '.join(accepted)}")
            tables = layer.pop("classes", {})
            if not isinstance(tables, Mapping):
                raise ConfigurationError(f"setting classes={tables!r} must be a table of class tables, e.g. "
                                         '[classes.highmem] memory = "128Gi"')
            for name, table in tables.items():
                if not isinstance(table, Mapping):
                    raise ConfigurationError(f"resource class {name!r} must be a table of {', '.join(CLASS_KEYS)}")
                classes.setdefault(name, {}).update(table)
            merged.update(layer)
        core = cls._from_table(merged, classes)
        built = {section: section.from_table(merged, core.home, core.catalog) for section in sections}
        return replace(core, sections=built)

    def signing_secret(self) -> str | None:
        """The signing secret: configured, or the one of a ``sluice up`` running here."""
        return self.remote_secret or str((embedded_state(self.home) or {}).get("remote_secret") or "") or None

    def section(self, kind: type[S]) -> S:
        """A capability's settings section; one its capability did not load is an error."""
        try:
            return self.sections[kind]  # type: ignore[no-any-return]
        except KeyError:
            raise ConfigurationError(f"settings were loaded without the {kind.__name__} section; load them with "
                                     "the capability that reads it installed") from None

    @classmethod
    def _from_table(cls, table: dict[str, Any], classes: dict[str, dict[str, Any]]) -> Settings:
        defaults = cls()
        try:
            default_compute = Compute(cpu=table.get("default_cpu", defaults.default_compute.cpu),
                                      memory=table.get("default_memory", defaults.default_compute.memory))
        except ConfigurationError as exc:
            raise ConfigurationError(f"setting default_cpu/default_memory: {exc}") from None
        return cls(
            broker_url=text(table, "broker_url"),
            result_backend=text(table, "result_backend"),
            default_compute=default_compute,
            visibility_timeout=bounded(table, "visibility_timeout", defaults.visibility_timeout, int,
                                       *BOUNDS["visibility_timeout"]),
            watchdog_interval=bounded(table, "watchdog_interval", defaults.watchdog_interval, float,
                                      *BOUNDS["watchdog_interval"]),
            heartbeat_interval=bounded(table, "heartbeat_interval", defaults.heartbeat_interval, float,
                                       *BOUNDS["heartbeat_interval"]),
            reaper_interval=bounded(table, "reaper_interval", defaults.reaper_interval, float,
                                    *BOUNDS["reaper_interval"]),
            orphan_grace=bounded(table, "orphan_grace", defaults.orphan_grace, float, *BOUNDS["orphan_grace"]),
            home=path(table, "home") or defaults.home,
            remote_secret=text(table, "remote_secret"),
            catalog=(catalog := Catalog.merged(classes)),
            intake_queue=intake_queue(table, catalog, defaults.intake_queue),
            auto_min_runs=bounded(table, "auto_min_runs", defaults.auto_min_runs, int, *BOUNDS["auto_min_runs"]),
            auto_headroom=bounded(table, "auto_headroom", defaults.auto_headroom, float, *BOUNDS["auto_headroom"]),
            auto_floor=memory_size(table, "auto_floor", defaults.auto_floor),
            run_ttl=bounded(table, "run_ttl", defaults.run_ttl, float, *BOUNDS["run_ttl"]),
            sentinel_master=text(table, "sentinel_master"),
            sentinel_password=text(table, "sentinel_password"),
        )


#: Each numeric core setting's accepted range, inclusive.
BOUNDS = {"visibility_timeout": (1, 10 * 365 * 86_400), "watchdog_interval": (0.005, 10.0),
          "heartbeat_interval": (0.1, 60.0), "reaper_interval": (0.1, 3600.0), "orphan_grace": (0.1, 86_400.0),
          "auto_min_runs": (1, 1_000_000), "auto_headroom": (1.0, 100.0), "run_ttl": (1.0, 10 * 365 * 86_400.0)}


def bounded(table: Mapping[str, Any], key: str, default: Any, kind: type, low: float, high: float,
            low_open: bool = False) -> Any:
    """A positive number setting within ``[low, high]`` (``(low, high]`` with ``low_open``): from a
    file a real number (never a bool), from the environment its ASCII text; ``kind`` int wants a
    whole number. Anything else is a ConfigurationError naming the setting, the value and the range."""
    if key not in table:
        return default
    raw = table[key]
    value: object = raw
    if isinstance(raw, str):
        text = raw.strip()
        try:
            value = float(text) if text.isascii() and len(text) <= 32 else raw
        except ValueError:
            value = raw
    whole = " whole" if kind is int else ""
    span = f"above {low:g} and at most {high:g}" if low_open else f"from {low:g} to {high:g}"
    accepted = f"must be a positive{whole} number {span}"
    try:
        number = real_number(value, f"setting {key}", low, high, low_open=low_open)
    except ConfigurationError:
        raise ConfigurationError(f"setting {key}={raw!r} {accepted}") from None
    if kind is int and number != int(number):
        raise ConfigurationError(f"setting {key}={raw!r} {accepted}")
    return int(number) if kind is int else number


def path(table: Mapping[str, Any], key: str) -> Path | None:
    """A path setting, ``~`` expanded; None when unset."""
    value = text(table, key)
    try:
        return Path(value).expanduser() if value else None
    except RuntimeError:  # "~name" of a user this machine does not have
        raise ConfigurationError(f"setting {key}: {value!r} names the home of a user this machine does not have; "
                                 "give a path (~ alone means your own home)") from None


def fallback_memory(default: Compute, settings: Settings) -> int:
    """The memory "auto" runs with until learned: ``default``'s, the settings', else the built-in."""
    return next(c.memory_bytes for c in (default, settings.default_compute, BUILTIN_DEFAULT_COMPUTE) if c.memory_bytes)


def memory_size(table: Mapping[str, Any], key: str, default: int) -> int:
    """A memory quantity setting ("64Mi"), in bytes."""
    if key not in table:
        return default
    try:
        return parse_memory(table[key])
    except ConfigurationError as exc:
        raise ConfigurationError(f"setting {key}: {exc}") from None


def intake_queue(table: Mapping[str, Any], catalog: Catalog, default: str) -> str:
    """The intake queue's name: a queue name that is not one of the resource classes."""
    name = text(table, "intake_queue") or default
    if not name.replace("-", "").replace("_", "").replace(".", "").isalnum() or name in catalog:
        raise ConfigurationError(f"setting intake_queue={name!r} must be a queue name (letters, digits, '-', '_', "
                                 f"'.') that is not a resource class ({', '.join(catalog.names)})")
    return name


def text(table: Mapping[str, Any], key: str) -> str | None:
    """A text setting (a URL, a path, a secret); unset or empty is None."""
    value = table.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigurationError(f"setting {key}={value!r} must be text (a string)")
    return value


def fraction(table: Mapping[str, Any], key: str, default: float) -> float:
    """A share: a number greater than 0 and at most 1."""
    return float(bounded(table, key, default, float, 0, 1, low_open=True))


def flag(table: Mapping[str, Any], key: str) -> bool:
    value = table.get(key, False)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"setting {key}={value!r} must be true or false (1/0, yes/no, on/off)")


def names(table: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    """A list of names, or in env a comma-separated string."""
    value = table.get(key)
    if value is None or value == "":
        return None
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n.strip() for n in names):
        raise ConfigurationError(f"setting {key}={value!r} must be a list of class names (env: comma-separated)")
    return tuple(n.strip() for n in names)


def _config_path(cwd: Path, env: Mapping[str, str]) -> Path:
    explicit = env.get(CONFIG_ENV)
    if explicit and not Path(explicit).is_file():
        raise ConfigurationError(f"SLUICE_CONFIG={explicit!r} is not a file; point it at a sluice.toml")
    return Path(explicit) if explicit else cwd / "sluice.toml"


def _toml_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{path} is not valid TOML: {exc}") from None


def _pyproject_table(path: Path) -> dict[str, Any]:
    return dict(_toml_file(path).get("tool", {}).get("sluice", {}))


#: ``SLUICE_*`` variables that are not settings: the config file's path and the GPU overrides.
CONFIG_ENV, GPU_COUNT_ENV, GPU_MEMORY_ENV = "SLUICE_CONFIG", "SLUICE_GPU_COUNT", "SLUICE_GPU_MEMORY"


def warn_unknown_env(env: Mapping[str, str], accepted: tuple[str, ...]) -> list[str]:
    """Warn once per process about each ``SLUICE_*`` variable sluice does not read (a typo such
    as ``SLUICE_VISIBILTY_TIMEOUT`` would otherwise be ignored), naming the closest known one."""
    known = [f"SLUICE_{key.upper()}" for key in accepted] + [CONFIG_ENV, GPU_COUNT_ENV, GPU_MEMORY_ENV]
    unknown = sorted(name for name in env if name.startswith("SLUICE_") and name not in known)
    for name in unknown:
        if name not in _warned:
            _warned.add(name)
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; sluice reads {', '.join(known)}"
            log.warning("ignoring environment variable %s: it is not a sluice setting%s", name, hint)
    return unknown


_warned: set[str] = set()


def _env_table(env: Mapping[str, str], accepted: tuple[str, ...]) -> dict[str, Any]:
    """``SLUICE_<SETTING>`` for each setting; ``SLUICE_CLASSES`` is a JSON object of class tables."""
    warn_unknown_env(env, accepted)
    table: dict[str, Any] = {}
    for key in accepted:
        value = env.get(f"SLUICE_{key.upper()}")
        if value is None or value == "":
            continue
        if key == "classes":
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigurationError(
                    f"SLUICE_CLASSES={value!r} is not JSON; use an object such as "
                    '{"highmem": {"memory": "128Gi"}}') from exc
            if not isinstance(value, dict):
                raise ConfigurationError(f"SLUICE_CLASSES={value!r} must be a JSON object of class tables")
        table[key] = value
    return table


def embedded_state_path(home: Path) -> Path:
    """Where a running ``sluice up`` writes its broker URL and children, for other processes to find."""
    return home / "up.json"


def embedded_state(home: Path) -> dict[str, Any] | None:
    """What a ``sluice up`` running on this machine wrote about itself, if one is running."""
    try:
        state = json.loads(embedded_state_path(home).read_text())
        os.kill(int(state["pid"]), 0)
        return dict(state)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def embedded_broker_url(home: Path) -> str | None:
    """The broker URL of a ``sluice up`` running on this machine, if one is."""
    state = embedded_state(home)
    return str(state["broker_url"]) if state and state.get("broker_url") else None
