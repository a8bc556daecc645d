"""Declaring a setting once: a dataclass field naming its kind (type, accepted forms, bounds),
its help and the keys it is read from; its default is the field's.

Everything else is derived from these declarations: the names a layer may hold (an unknown one
is an error), each key's environment variable (``SLUICE_<KEY>``), how a layer's raw values are
read and merged (:mod:`sluice.config.sources`), and how they are checked and converted
(:mod:`sluice.config.values`). The core's settings (:class:`sluice.config.Settings`) and each
capability's section are declared this way.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice.config.values import Kind
from sluice.errors import ConfigurationError

#: The field metadata key under which a setting's declaration is kept.
_SPEC = "sluice.setting"


@dataclass(frozen=True)
class Spec:
    """One setting's declaration (see :func:`setting`)."""

    kind: Kind
    help: str
    #: The flat keys the setting is read from (in files, and as ``SLUICE_<KEY>`` in the environment).
    keys: tuple[str, ...]

    @property
    def label(self) -> str:
        """The name errors give the setting: its key, or its keys joined by "/"."""
        return "/".join(self.keys)


def setting(
    kind: Kind,
    help: str,
    *,
    default: Any = dataclasses.MISSING,
    factory: Callable[[], Any] | Any = dataclasses.MISSING,
    keys: tuple[str, ...] = (),
) -> Any:
    """Declare the field it is assigned to as a setting read by ``kind``, keyed by the field's name
    (or by ``keys``: a kind that reads several gets a table of those given), with ``default`` (or
    ``factory``) when no layer gives it. ``help`` says what it is for."""
    return dataclasses.field(default=default, default_factory=factory, metadata={_SPEC: Spec(kind, help, keys)})


@functools.cache
def specs(cls: type) -> Mapping[str, Spec]:
    """The settings ``cls`` declares: field name -> declaration, in declaration order."""
    return {
        f.name: dataclasses.replace(f.metadata[_SPEC], keys=f.metadata[_SPEC].keys or (f.name,))
        for f in dataclasses.fields(cls)
        if _SPEC in f.metadata
    }


def setting_keys(cls: type) -> tuple[str, ...]:
    """Every key ``cls``'s settings are read from, in declaration order."""
    return tuple(key for spec in specs(cls).values() for key in spec.keys)


def kinds(classes: Iterable[type]) -> dict[str, Kind]:
    """Every key the settings of ``classes`` are read from, with the kind that reads it; a key two
    of them declare is an error (the flat namespace is shared by the core and every section)."""
    found: dict[str, Kind] = {}
    for cls in classes:
        for spec in specs(cls).values():
            for key in spec.keys:
                if key in found:
                    raise ConfigurationError(f"setting {key} is declared twice (again by {cls.__name__})")
                found[key] = spec.kind
    return found


def env_name(key: str) -> str:
    """The environment variable a setting's key is read from."""
    return f"SLUICE_{key.upper()}"


def read(cls: type, table: Mapping[str, Any]) -> dict[str, Any]:
    """``cls``'s settings given in ``table`` (the merged layers' raw values), each read by its
    kind: field name -> value. One not given, or given empty, is left out: it keeps its default."""
    values = {}
    for name, spec in specs(cls).items():
        given = {key: table[key] for key in spec.keys if key in table}
        if not given:
            continue
        value = spec.kind.read(given[spec.keys[0]] if len(spec.keys) == 1 else given, spec.label)
        if value is not None:
            values[name] = value
    return values


def shared(cls: type, core: object) -> dict[str, Any]:
    """A section's fields that are not settings, taken from the core settings of the same name."""
    declared = specs(cls)
    return {f.name: getattr(core, f.name) for f in dataclasses.fields(cls) if f.init and f.name not in declared}
