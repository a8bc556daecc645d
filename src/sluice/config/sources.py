"""Where settings come from: ``[tool.sluice]`` in pyproject.toml, sluice.toml (or the file named
by ``SLUICE_CONFIG``) and ``SLUICE_*`` variables, merged, lowest first, into one table of raw
values. Which keys a layer may hold, and how each is read from the environment and merged, comes
from the settings' declarations (:mod:`sluice.config.declare`); the values are read there too.
"""

from __future__ import annotations

import difflib
import logging
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sluice.config.declare import env_name
from sluice.config.values import Kind
from sluice.errors import ConfigurationError

log = logging.getLogger("sluice.config")

#: ``SLUICE_*`` variables that are not settings: the config file's path and the GPU overrides.
CONFIG_ENV, GPU_COUNT_ENV, GPU_MEMORY_ENV = "SLUICE_CONFIG", "SLUICE_GPU_COUNT", "SLUICE_GPU_MEMORY"


def merged_layers(cwd: Path, env: Mapping[str, str], kinds: Mapping[str, Kind]) -> dict[str, Any]:
    """pyproject.toml, then sluice.toml, then the environment, each over the one before; a key
    no setting declares is a ConfigurationError naming it and the accepted ones."""
    accepted = tuple(kinds)
    merged: dict[str, Any] = {}
    for layer in (_pyproject_table(cwd / "pyproject.toml"), _toml_file(_config_path(cwd, env)), _env_table(env, kinds)):
        unknown = set(layer) - set(accepted)
        if unknown:
            raise ConfigurationError(f"unknown sluice settings {sorted(unknown)}; accepted: {', '.join(accepted)}")
        for key, value in layer.items():
            merged[key] = kinds[key].merge(merged.get(key), value, key)
    return merged


def _config_path(cwd: Path, env: Mapping[str, str]) -> Path:
    explicit = env.get(CONFIG_ENV)
    if explicit and not Path(explicit).is_file():
        raise ConfigurationError(f"SLUICE_CONFIG={explicit!r} is not a file; point it at a sluice.toml")
    return Path(explicit) if explicit else cwd / "sluice.toml"


def _toml_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path} is not valid TOML: {exc}") from None


def _pyproject_table(path: Path) -> dict[str, Any]:
    tool = _toml_file(path).get("tool", {})
    table = tool.get("sluice", {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        raise ConfigurationError(f"{path}: [tool.sluice] must be a table of settings, not {table!r}")
    return dict(table)


def _env_table(env: Mapping[str, str], kinds: Mapping[str, Kind]) -> dict[str, Any]:
    """``SLUICE_<KEY>`` for each key, read from its text by the key's kind; empty is unset."""
    warn_unknown_env(env, tuple(kinds))
    table: dict[str, Any] = {}
    for key, kind in kinds.items():
        value = env.get(env_name(key))
        if value is not None and value != "":
            table[key] = kind.from_env(value, env_name(key))
    return table


def warn_unknown_env(env: Mapping[str, str], accepted: tuple[str, ...]) -> None:
    """Warn once per process about each ``SLUICE_*`` variable sluice does not read (a typo such
    as ``SLUICE_VISIBILTY_TIMEOUT`` would otherwise be ignored), naming the closest known one."""
    known = [env_name(key) for key in accepted] + [CONFIG_ENV, GPU_COUNT_ENV, GPU_MEMORY_ENV]
    unknown = sorted(name for name in env if name.startswith("SLUICE_") and name not in known)
    for name in unknown:
        if name not in _warned:
            _warned.add(name)
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; sluice reads {', '.join(known)}"
            log.warning("ignoring environment variable %s: it is not a sluice setting%s", name, hint)


_warned: set[str] = set()
