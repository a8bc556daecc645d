"""Package environments for remote calls, installed with ``uv pip install`` and cached by content.

An environment is a directory of packages installed with ``--target``; a sandbox appends it to
``sys.path``, so the worker's base environment always wins for what it provides. Environments
are keyed by the normalized requirement set (the same list gives the same directory on every
worker), built once under a file lock (pool processes may ask for the same one at once), and
removed least-recently-used first once the cache passes its size cap. With
``fresh_env_per_call`` every call installs into a temporary directory that is removed after it.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from packaging.utils import canonicalize_name

from sluice.errors import InvalidRequestError
from sluice.tasks.remote.packages import InstallPlan, environment_key

log = logging.getLogger("sluice.envs")
READY = ".sluice-ready"


@functools.cache
def base_distributions() -> dict[str, str | None]:
    """Canonical name -> version of every distribution in this interpreter's environment."""
    found: dict[str, str | None] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name:
            found.setdefault(canonicalize_name(name), dist.version or None)
    return found


def uv_binary() -> str:
    """The ``uv`` executable: the one shipped with the ``uv`` package, else the one on PATH."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise InvalidRequestError(
                "cannot install packages: uv is not installed on this worker (pip install uv)"
            ) from None
        return found


def install(entries: tuple[str, ...], target: Path, output: Callable[[str], None]) -> None:
    """``uv pip install --target`` the entries, streaming the installer's lines to ``output``."""
    command = [uv_binary(), "pip", "install", "--target", str(target), "--python", sys.executable, *entries]
    output(f"installing {' '.join(entries)}")
    lines: list[str] = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ | {"NO_COLOR": "1"}
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip())
            output(line.rstrip())
    if process.returncode != 0:
        raise InvalidRequestError(
            f"installing {' '.join(entries)} failed (uv exit {process.returncode}):\n" + "\n".join(lines)
        )


class EnvironmentCache:
    """Directories of installed packages under ``root``, one per requirement set."""

    def __init__(self, root: Path, max_bytes: int, fresh_per_call: bool = False) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.fresh_per_call = fresh_per_call

    @contextmanager
    def environment(self, plan: InstallPlan, output: Callable[[str], None]) -> Iterator[Path | None]:
        """The environment for ``plan`` (None when nothing needs installing), for one call."""
        if not plan.install:
            yield None
        elif self.fresh_per_call:
            with tempfile.TemporaryDirectory(prefix="sluice-env-") as tmp:
                install(plan.install, Path(tmp), output)
                yield Path(tmp)
        else:
            yield self.cached(plan, output)

    def remember(self, requested: tuple[str, ...], plan: InstallPlan) -> None:
        """Note that a requested package list (as the client sent it) uses ``plan``'s environment."""
        aliases = self.root / "requested"
        aliases.mkdir(parents=True, exist_ok=True)
        (aliases / environment_key(requested)).write_text(plan.key)

    def held(self) -> list[str]:
        """Keys of the requested package lists whose environment is ready here (for heartbeats)."""
        aliases = self.root / "requested"
        if not aliases.is_dir():
            return []
        return sorted(
            alias.name for alias in aliases.iterdir() if (self.root / alias.read_text().strip() / READY).exists()
        )

    def cached(self, plan: InstallPlan, output: Callable[[str], None]) -> Path:
        path = self.root / plan.key
        self.root.mkdir(parents=True, exist_ok=True)
        if not (path / READY).exists():
            with open(self.root / f"{plan.key}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (path / READY).exists():
                    self._build(plan, path, output)
        else:
            output(f"using cached environment {plan.key} for {' '.join(plan.install)}")
        os.utime(path / READY)
        return path

    def _build(self, plan: InstallPlan, path: Path, output: Callable[[str], None]) -> None:
        staging = Path(tempfile.mkdtemp(prefix=f"{plan.key}.", dir=self.root))
        try:
            install(plan.install, staging, output)
            (staging / READY).write_text("\n".join(plan.install) + "\n")
            shutil.rmtree(path, ignore_errors=True)
            staging.rename(path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.evict(keep=path)

    def evict(self, keep: Path) -> list[Path]:
        """Remove least-recently-used environments until the cache fits its cap (never ``keep``)."""
        entries = [(p, (p / READY).stat().st_mtime, _size(p)) for p in self.root.iterdir() if (p / READY).exists()]
        total = sum(size for _, _, size in entries)
        removed = []
        for path, _, size in sorted(entries, key=lambda e: e[1]):
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            shutil.rmtree(path, ignore_errors=True)
            total -= size
            removed.append(path)
            log.info("removed package environment %s (least recently used; cache over its cap)", path.name)
        return removed


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
