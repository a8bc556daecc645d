"""Remote functions' settings section: sizes, classes and package environments.

Read with the rest of the settings (flat keys ``remote_*``, ``env_dir``, ... and their
``SLUICE_*`` variables; see the README's Configuration table) and validated when loaded: a
``remote_classes`` naming a class that does not exist fails here, naming the known classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.config import Section, Settings, setting
from sluice.config.values import SHARE, Flag, Names, Number, PathValue, Size
from sluice.errors import ConfigurationError
from sluice.queues.catalog import Catalog


@dataclass(frozen=True)
class RemoteSettings(Section):
    """Everything configurable about remote calls."""

    #: The core setting: where ``env_dir`` defaults to.
    home: Path
    remote_memory: int = setting(Size(), "A remote function's starting memory when it names none", default=1 << 30)
    remote_classes: tuple[str, ...] | None = setting(
        Names(), "Classes whose workers run remote calls; none means every class", default=None
    )
    remote_growth_threshold: float = setting(
        SHARE, "A sandbox's limit grows when its memory passes this share of the limit ...", default=0.9
    )
    remote_growth_factor: float = setting(
        Number(1, 100, low_open=True), "... by this factor, up to max_memory", default=2.0
    )
    remote_memory_share: float = setting(
        SHARE, "Without max_memory, growth stops at this share of the worker's slot", default=0.8
    )
    env_dir: Path | None = setting(
        PathValue(), "Where workers keep package environments (default: <home>/envs)", default=None
    )
    env_cache_size: int = setting(
        Size(), "Least-recently-used environments are removed past this many bytes", default=10 << 30
    )
    fresh_env_per_call: bool = setting(Flag(), "Install packages for every call (no environment cache)", default=False)
    stream_logs: bool = setting(
        Flag(), "Stream installer and function output to the caller as it happens", default=False
    )

    def check(self, core: Settings) -> None:
        check_classes(self.remote_classes, core.catalog)

    @property
    def envs_path(self) -> Path:
        """Where a worker keeps package environments."""
        return self.env_dir or self.home / "envs"


def check_classes(classes: tuple[str, ...] | None, catalog: Catalog) -> None:
    """A ``remote_classes`` entry that is not a class of ``catalog`` is a ConfigurationError."""
    unknown = [name for name in classes or () if name not in catalog]
    if unknown:
        raise ConfigurationError(
            f"setting remote_classes names {', '.join(map(repr, unknown))}, which "
            f"{'is not a class' if len(unknown) == 1 else 'are not classes'}; "
            f"classes: {', '.join(catalog.names)}"
        )


def remote_settings(app: Any) -> RemoteSettings:
    """The remote-functions section of an app's settings."""
    return app.settings.section(RemoteSettings)
