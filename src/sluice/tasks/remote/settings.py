"""Remote functions' settings section: the signing secret, sizes, classes and package environments.

Read with the rest of the settings (flat keys ``remote_*``, ``env_dir``, ... and their
``SLUICE_*`` variables; see the README's Configuration table) and validated when loaded: a
``remote_classes`` naming a class that does not exist fails here, naming the known classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sluice.config import bounded, flag, fraction, names, path
from sluice.errors import ConfigurationError
from sluice.queues.catalog import Catalog
from sluice.units import parse_size


@dataclass(frozen=True)
class RemoteSettings:
    """Everything configurable about remote calls."""

    KEYS: ClassVar[tuple[str, ...]] = (
        "remote_memory", "remote_classes", "remote_growth_threshold", "remote_growth_factor",
        "remote_memory_share", "env_dir", "env_cache_size", "fresh_env_per_call", "stream_logs")

    home: Path
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
    def from_table(cls, table: Mapping[str, Any], home: Path, catalog: Catalog) -> RemoteSettings:
        defaults = cls(home)
        classes = names(table, "remote_classes")
        check_classes(classes, catalog)
        return cls(
            home=home,
            remote_memory=parse_size(table.get("remote_memory", defaults.remote_memory), "setting remote_memory"),
            remote_classes=classes,
            remote_growth_threshold=fraction(table, "remote_growth_threshold", defaults.remote_growth_threshold),
            remote_growth_factor=bounded(table, "remote_growth_factor", defaults.remote_growth_factor, float, 1, 100,
                                         low_open=True),
            remote_memory_share=fraction(table, "remote_memory_share", defaults.remote_memory_share),
            env_dir=path(table, "env_dir"),
            env_cache_size=parse_size(table.get("env_cache_size", defaults.env_cache_size), "setting env_cache_size"),
            fresh_env_per_call=flag(table, "fresh_env_per_call"),
            stream_logs=flag(table, "stream_logs"),
        )

    @property
    def envs_path(self) -> Path:
        """Where a worker keeps package environments."""
        return self.env_dir or self.home / "envs"


def check_classes(classes: tuple[str, ...] | None, catalog: Catalog) -> None:
    """A ``remote_classes`` entry that is not a class of ``catalog`` is a ConfigurationError."""
    unknown = [name for name in classes or () if name not in catalog]
    if unknown:
        raise ConfigurationError(f"setting remote_classes names {', '.join(map(repr, unknown))}, which "
                                 f"{'is not a class' if len(unknown) == 1 else 'are not classes'}; "
                                 f"classes: {', '.join(catalog.names)}")


def remote_settings(app: Any) -> RemoteSettings:
    """The remote-functions section of an app's settings."""
    return app.settings.section(RemoteSettings)  # type: ignore[no-any-return]
