"""The task-file contract: a Python file with ``plan()`` and ``execute(item)``.

``plan()`` yields dicts, each with an ``id`` (a UUID is given to one without); ``execute(item)``
gets exactly what plan() yielded and returns a JSON-serializable dict. Arguments after ``--``
reach the file's own argparse as ``python task.py ...`` would (``sys.argv`` is set for it). An
optional module-level ``COMPUTE = sluice.Compute(...)`` sizes every item of the run.
"""

from __future__ import annotations

import hashlib
import sys
import types
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.compute import Compute
from sluice.errors import ConfigurationError


@contextmanager
def script_argv(filename: str, argv: list[str]) -> Iterator[None]:
    """``sys.argv`` as ``python filename argv...`` would set it, for the file's argparse."""
    saved = sys.argv
    sys.argv = [filename, *argv]
    try:
        yield
    finally:
        sys.argv = saved


@dataclass
class TaskFile:
    filename: str
    source: str
    argv: list[str]
    module: types.ModuleType

    @classmethod
    def load(cls, path: str | Path, argv: list[str] | None = None) -> TaskFile:
        path = Path(path)
        if not path.is_file():
            raise ConfigurationError(f"task file {str(path)!r} does not exist; give a .py file with plan() and execute()")
        return cls.from_source(str(path), path.read_text(), list(argv or []))

    @classmethod
    def from_source(cls, filename: str, source: str, argv: list[str]) -> TaskFile:
        """Build the module from source text (workers get it from Redis, not from disk)."""
        name = "sluice_task_" + hashlib.sha1(source.encode()).hexdigest()[:12]
        module = types.ModuleType(name)
        module.__file__ = filename
        with script_argv(filename, argv):
            exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - running the user's task file
        for needed in ("plan", "execute"):
            if not callable(getattr(module, needed, None)):
                raise ConfigurationError(f"task file {filename!r} has no {needed}() function; a task file defines "
                                         "plan() (yields dicts with an 'id') and execute(item) (returns a dict)")
        compute = getattr(module, "COMPUTE", None)
        if compute is not None and not isinstance(compute, Compute):
            raise ConfigurationError(f"{filename}: COMPUTE={compute!r} must be a sluice.Compute")
        return cls(filename, source, argv, module)

    @property
    def compute(self) -> Compute | None:
        return getattr(self.module, "COMPUTE", None)

    def plan(self) -> Iterator[dict[str, Any]]:
        """plan()'s items, lazily, each with a string id (argv stays set while plan() runs)."""
        with script_argv(self.filename, self.argv):
            for item in self.module.plan():
                if not isinstance(item, dict):
                    raise ConfigurationError(f"plan() yielded {item!r}; each item must be a dict with an 'id'")
                if item.get("id") is None:
                    item["id"] = str(uuid.uuid4())
                elif not isinstance(item["id"], str):
                    item["id"] = str(item["id"])
                yield item

    def execute(self, item: dict[str, Any]) -> Any:
        with script_argv(self.filename, self.argv):
            return self.module.execute(item)
