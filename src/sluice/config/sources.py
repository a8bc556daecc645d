"""Where settings come from: ``[tool.sluice]`` in pyproject.toml, sluice.toml (or the file named
by ``SLUICE_CONFIG``) and ``SLUICE_*`` variables, merged, lowest first, into one table of raw
values. Which keys a layer may hold, and how each is read from the environment and merged, comes
from the settings' declarations (:mod:`sluice.config.declare`); the values are read there too.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sluice.config.declare import env_name
from sluice.config.values import Kind
from sluice.errors import ConfigurationError

#: ``SLUICE_*`` variables that are not settings: the config file's path and the GPU overrides.
CONFIG_ENV, GPU_COUNT_ENV, GPU_MEMORY_ENV = "SLUICE_CONFIG", "SLUICE_GPU_COUNT", "SLUICE_GPU_MEMORY"
#: Exported for ``docker compose`` (the compose file interpolates them), often in the same shell.
REDIS_PASSWORD_ENV, FLOWER_AUTH_ENV = "SLUICE_REDIS_PASSWORD", "SLUICE_FLOWER_AUTH"
NOT_SETTINGS = (CONFIG_ENV, GPU_COUNT_ENV, GPU_MEMORY_ENV, REDIS_PASSWORD_ENV, FLOWER_AUTH_ENV)
#: What Kubernetes puts into a pod's environment for each Service of its namespace with service
#: links on (``SLUICE_REDIS_SERVICE_HOST``, ``SLUICE_REDIS_PORT_6379_TCP_ADDR``...): the pods of
#: a user's own app, beside sluice's Services, have them.
SERVICE_LINK = re.compile(
    r"[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)(_ADDR|_PORT|_PROTO)?)?)"
)


def merged_layers(
    cwd: Path, env: Mapping[str, str], kinds: Mapping[str, Kind], declared: Iterable[str] = ()
) -> dict[str, Any]:
    """pyproject.toml, then sluice.toml, then the environment, each over the one before; a key
    no setting declares is a ConfigurationError naming it and the accepted ones. ``declared``:
    settings of capabilities not loaded here, whose variables are left alone (one environment
    serves apps with and without a capability) where their keys in a file are refused."""
    accepted = tuple(kinds)
    refuse_unknown_env(env, (*accepted, *declared))
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
    table: dict[str, Any] = {}
    for key, kind in kinds.items():
        value = env.get(env_name(key))
        if value is not None and value != "":
            table[key] = kind.from_env(value, env_name(key))
    return table


def refuse_unknown_env(env: Mapping[str, str], accepted: Iterable[str]) -> None:
    """A ``SLUICE_*`` variable sluice does not read is a ConfigurationError naming it and the
    closest known one: a typo such as ``SLUICE_VISIBILTY_TIMEOUT`` is never ignored."""
    known = [env_name(key) for key in accepted] + list(NOT_SETTINGS)
    unknown = sorted(
        name for name in env if name.startswith("SLUICE_") and name not in known and not SERVICE_LINK.fullmatch(name)
    )
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=1)
            hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
        raise ConfigurationError(
            f"environment variables that are not sluice settings: {', '.join(hints)}; unset or rename "
            f"them (sluice reads {', '.join(known)})"
        )
