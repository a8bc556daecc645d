"""Settings: one frozen object read from env ``SLUICE_*`` over ``sluice.toml`` over pyproject.

Precedence, highest first:

1. arguments given to :class:`sluice.App` in code;
2. environment variables ``SLUICE_*``;
3. ``sluice.toml`` in the working directory (or the file named by ``SLUICE_CONFIG``);
4. ``[tool.sluice]`` in ``pyproject.toml`` in the working directory;
5. built-in defaults.

Resource classes from every layer are merged by name onto the default ladder (see
:meth:`sluice.queues.Catalog.merged`).
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.compute import Compute
from sluice.errors import ConfigurationError
from sluice.queues.catalog import Catalog
from sluice.units import parse_size

SETTING_KEYS = ("broker_url", "result_backend", "default_cpu", "default_memory", "visibility_timeout",
                "watchdog_interval", "heartbeat_interval", "reaper_interval", "orphan_grace", "home", "classes",
                "remote_secret", "remote_memory", "remote_classes", "remote_growth_threshold",
                "remote_growth_factor", "remote_memory_share", "env_dir", "env_cache_size",
                "fresh_env_per_call", "stream_logs")

#: Longer than any task should run: a task still running on a live worker must never be redelivered.
DEFAULT_VISIBILITY_TIMEOUT = 6 * 3600


@dataclass(frozen=True)
class Settings:
    """Everything configurable, resolved once."""

    broker_url: str | None = None
    result_backend: str | None = None
    default_compute: Compute = field(default_factory=lambda: Compute(cpu="1", memory="512Mi"))
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
    #: Shared secret that signs remote-call payloads (HMAC-SHA256); no secret, no remote calls.
    remote_secret: str | None = None
    #: A remote function's starting memory when it names none.
    remote_memory: int = 1 << 30
    #: Classes whose workers run remote calls; None means every class.
    remote_classes: tuple[str, ...] | None = None
    #: A sandbox's limit grows when its memory passes this share of the limit ...
    remote_growth_threshold: float = 0.9
    #: ... by this factor, up to max_memory.
    remote_growth_factor: float = 2.0
    #: Without max_memory, growth stops at this share of the worker's slot.
    remote_memory_share: float = 0.8
    #: Where workers keep package environments (default: ``<home>/envs``).
    env_dir: Path | None = None
    #: Least-recently-used environments are removed past this many bytes.
    env_cache_size: int = 10 << 30
    #: True restores a fresh install for every call (no environment cache).
    fresh_env_per_call: bool = False
    #: Stream installer and function output to the caller as it happens.
    stream_logs: bool = False

    @classmethod
    def load(cls, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
        """Read every layer (see the module docstring) and validate the result."""
        env = os.environ if env is None else env
        cwd = Path.cwd() if cwd is None else cwd
        layers = [_pyproject_table(cwd / "pyproject.toml"), _toml_file(_config_path(cwd, env)), _env_table(env)]
        merged: dict[str, Any] = {}
        classes: dict[str, dict[str, Any]] = {}
        for layer in layers:
            unknown = set(layer) - set(SETTING_KEYS)
            if unknown:
                raise ConfigurationError(f"unknown sluice settings {sorted(unknown)}; accepted: {', '.join(SETTING_KEYS)}")
            for name, table in dict(layer.pop("classes", {})).items():
                classes.setdefault(name, {}).update(table)
            merged.update(layer)
        return cls._from_table(merged, classes)

    @classmethod
    def _from_table(cls, table: dict[str, Any], classes: dict[str, dict[str, Any]]) -> Settings:
        defaults = cls()
        default_compute = Compute(cpu=table.get("default_cpu", defaults.default_compute.cpu),
                                  memory=table.get("default_memory", defaults.default_compute.memory))
        return cls(
            broker_url=table.get("broker_url") or None,
            result_backend=table.get("result_backend") or None,
            default_compute=default_compute,
            visibility_timeout=_positive(table, "visibility_timeout", defaults.visibility_timeout, int),
            watchdog_interval=_positive(table, "watchdog_interval", defaults.watchdog_interval, float),
            heartbeat_interval=_positive(table, "heartbeat_interval", defaults.heartbeat_interval, float),
            reaper_interval=_positive(table, "reaper_interval", defaults.reaper_interval, float),
            orphan_grace=_positive(table, "orphan_grace", defaults.orphan_grace, float),
            home=Path(table["home"]).expanduser() if table.get("home") else defaults.home,
            catalog=Catalog.merged(classes),
            remote_secret=table.get("remote_secret") or None,
            remote_memory=parse_size(table.get("remote_memory", defaults.remote_memory), "setting remote_memory"),
            remote_classes=_names(table, "remote_classes"),
            remote_growth_threshold=_fraction(table, "remote_growth_threshold", defaults.remote_growth_threshold),
            remote_growth_factor=_positive(table, "remote_growth_factor", defaults.remote_growth_factor, float),
            remote_memory_share=_fraction(table, "remote_memory_share", defaults.remote_memory_share),
            env_dir=Path(table["env_dir"]).expanduser() if table.get("env_dir") else None,
            env_cache_size=parse_size(table.get("env_cache_size", defaults.env_cache_size), "setting env_cache_size"),
            fresh_env_per_call=_flag(table, "fresh_env_per_call"),
            stream_logs=_flag(table, "stream_logs"),
        )

    @property
    def envs_path(self) -> Path:
        """Where a worker keeps package environments."""
        return self.env_dir or self.home / "envs"

    def signing_secret(self) -> str | None:
        """The remote-call secret: configured, or the one of a ``sluice up`` running here."""
        return self.remote_secret or str((embedded_state(self.home) or {}).get("remote_secret") or "") or None


def _positive(table: Mapping[str, Any], key: str, default: Any, kind: type) -> Any:
    if key not in table:
        return default
    try:
        value = kind(table[key])
    except (TypeError, ValueError):
        value = 0
    if value <= 0:
        raise ConfigurationError(f"setting {key}={table[key]!r} must be a positive number")
    return value


def _fraction(table: Mapping[str, Any], key: str, default: float) -> float:
    value = _positive(table, key, default, float)
    if value > 1:
        raise ConfigurationError(f"setting {key}={table[key]!r} must be a fraction between 0 and 1")
    return float(value)


def _flag(table: Mapping[str, Any], key: str) -> bool:
    value = table.get(key, False)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"setting {key}={value!r} must be true or false (1/0, yes/no, on/off)")


def _names(table: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    """A list of names, or in env a comma-separated string."""
    value = table.get(key)
    if value is None or value == "":
        return None
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n.strip() for n in names):
        raise ConfigurationError(f"setting {key}={value!r} must be a list of class names (env: comma-separated)")
    return tuple(n.strip() for n in names)


def _config_path(cwd: Path, env: Mapping[str, str]) -> Path:
    explicit = env.get("SLUICE_CONFIG")
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


def _env_table(env: Mapping[str, str]) -> dict[str, Any]:
    """``SLUICE_<SETTING>`` for each setting; ``SLUICE_CLASSES`` is a JSON object of class tables."""
    table: dict[str, Any] = {}
    for key in SETTING_KEYS:
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
