"""Value kinds: how one kind of setting is read from a file's typed value or the environment's text.

A setting's declaration (:func:`sluice.config.declare.setting`) names one of these kinds; the
kind alone knows its accepted forms and bounds, and refuses anything else with a
:class:`~sluice.errors.ConfigurationError` naming the setting, the value and what is accepted.
A kind that reads nothing from an empty value returns None, and the setting keeps its default.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.compute import Compute
from sluice.errors import ConfigurationError
from sluice.queues.catalog import CLASS_KEYS, Catalog
from sluice.units import parse_memory, parse_size, real_number


class Kind(ABC):
    """One kind of setting value: :meth:`read` checks and converts; the other two hooks have
    defaults that fit every kind but a table (the environment's text as is; a higher layer wins)."""

    @abstractmethod
    def read(self, raw: Any, key: str) -> Any:
        """The value of ``raw`` (a file's value or the environment's text); None keeps the default."""

    def from_env(self, text: str, name: str) -> Any:
        """The raw value of environment variable ``name``."""
        return text

    def merge(self, below: Any, above: Any, key: str) -> Any:
        """The raw value of a layer (``above``) over those below it (``below``, None for none)."""
        return above


@dataclass(frozen=True)
class Text(Kind):
    """Text (a URL, a path, a secret, a name); unset or empty is None."""

    def read(self, raw: Any, key: str) -> str | None:
        if raw is None or raw == "":
            return None
        if not isinstance(raw, str):
            raise ConfigurationError(f"setting {key}={raw!r} must be text (a string)")
        return raw


@dataclass(frozen=True)
class PathValue(Kind):
    """A path, ``~`` expanded; empty is None."""

    def read(self, raw: Any, key: str) -> Path | None:
        value = Text().read(raw, key)
        try:
            return Path(value).expanduser() if value else None
        except RuntimeError:  # "~name" of a user this machine does not have
            raise ConfigurationError(
                f"setting {key}: {value!r} names the home of a user this machine does not "
                "have; give a path (~ alone means your own home)"
            ) from None


@dataclass(frozen=True)
class Number(Kind):
    """A positive number within ``[low, high]`` (``(low, high]`` with ``low_open``): from a file a
    real number (never a bool), from the environment its ASCII text; ``whole`` wants an int."""

    low: float
    high: float
    whole: bool = False
    low_open: bool = False

    @property
    def accepted(self) -> str:
        low, high = (f"{int(x)}" if float(x).is_integer() else f"{x:g}" for x in (self.low, self.high))
        span = f"above {low} and at most {high}" if self.low_open else f"from {low} to {high}"
        return f"must be a positive{' whole' if self.whole else ''} number {span}"

    def read(self, raw: Any, key: str) -> int | float:
        value: object = raw
        if isinstance(raw, str):
            text = raw.strip()
            try:
                value = float(text) if text.isascii() and len(text) <= 32 else raw
            except ValueError:
                value = raw
        try:
            number = real_number(value, f"setting {key}", self.low, self.high, low_open=self.low_open)
        except ConfigurationError:
            raise ConfigurationError(f"setting {key}={raw!r} {self.accepted}") from None
        if self.whole and number != int(number):
            raise ConfigurationError(f"setting {key}={raw!r} {self.accepted}")
        return int(number) if self.whole else number


#: A share: greater than 0 and at most 1.
SHARE = Number(0, 1, low_open=True)


@dataclass(frozen=True)
class Flag(Kind):
    """True or false: a bool, or the text 1/0, true/false, yes/no, on/off (empty is false)."""

    def read(self, raw: Any, key: str) -> bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("", "0", "false", "no", "off"):
            return False
        raise ConfigurationError(f"setting {key}={raw!r} must be true or false (1/0, yes/no, on/off)")


@dataclass(frozen=True)
class Names(Kind):
    """A list of class names, or in the environment a comma-separated string; empty is None."""

    def read(self, raw: Any, key: str) -> tuple[str, ...] | None:
        if raw is None or raw == "":
            return None
        names = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n.strip() for n in names):
            raise ConfigurationError(f"setting {key}={raw!r} must be a list of class names (env: comma-separated)")
        return tuple(n.strip() for n in names)


@dataclass(frozen=True)
class Memory(Kind):
    """A memory quantity in the Kubernetes grammar ("64Mi", "1G", 67108864), in bytes."""

    def read(self, raw: Any, key: str) -> int:
        try:
            return parse_memory(raw)
        except ConfigurationError as exc:
            raise ConfigurationError(f"setting {key}: {exc}") from None


@dataclass(frozen=True)
class Size(Kind):
    """A byte size for budgets: int bytes, or a whole number with Ki/Mi/Gi/Ti or K/M/G/T."""

    def read(self, raw: Any, key: str) -> int:
        return parse_size(raw, f"setting {key}")


@dataclass(frozen=True)
class DefaultCompute(Kind):
    """A compute read from two settings, ``<prefix>_cpu`` and ``<prefix>_memory`` (a table of those
    given); an axis not given is the built-in one."""

    builtin: Compute

    def read(self, raw: Any, key: str) -> Compute:
        axes = {name.rsplit("_", 1)[-1]: value for name, value in raw.items()}
        try:
            return Compute(cpu=axes.get("cpu", self.builtin.cpu), memory=axes.get("memory", self.builtin.memory))
        except ConfigurationError as exc:
            raise ConfigurationError(f"setting {key}: {exc}") from None


@dataclass(frozen=True)
class ClassTables(Kind):
    """Resource classes: a table of class tables (env: a JSON object), merged by name across the
    layers onto the default ladder (see :meth:`sluice.queues.Catalog.merged`)."""

    def read(self, raw: Any, key: str) -> Catalog:
        return Catalog.merged(raw)

    def from_env(self, text: str, name: str) -> Any:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(
                f'{name}={text!r} is not JSON; use an object such as {{"highmem": {{"memory": "128Gi"}}}}'
            ) from exc
        if not isinstance(value, dict):
            raise ConfigurationError(f"{name}={text!r} must be a JSON object of class tables")
        return value

    def merge(self, below: Any, above: Any, key: str) -> dict[str, dict[str, Any]]:
        if not isinstance(above, Mapping):
            raise ConfigurationError(
                f'setting {key}={above!r} must be a table of class tables, e.g. [classes.highmem] memory = "128Gi"'
            )
        merged = {name: dict(table) for name, table in (below or {}).items()}
        for name, table in above.items():
            if not isinstance(table, Mapping):
                raise ConfigurationError(f"resource class {name!r} must be a table of {', '.join(CLASS_KEYS)}")
            merged.setdefault(name, {}).update(table)
        return merged
