"""The task-file contract: a Python file with ``plan()`` and ``execute(item)``.

``plan()`` yields dicts, each with an ``id`` (a UUID is given to one without); ``execute(item)``
gets exactly what plan() yielded and returns a JSON-serializable dict. Arguments after ``--``
reach the file's own argparse as ``python task.py ...`` would (``sys.argv`` is set for it). An
optional module-level ``COMPUTE = sluice.Compute(...)`` sizes every item of the run.

Workers load a run's task file from Redis, so what the driver stores there is signed with the
cluster's secret and bound to the run's id (:meth:`TaskFile.sealed`), and a worker runs none of
it before the signature holds (:meth:`TaskFile.unsealed`): write access to Redis is not enough
to run code on a worker.
"""

from __future__ import annotations

import hashlib
import json
import sys
import types
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.compute import Compute
from sluice.errors import ConfigurationError, InvalidRequestError
from sluice.signing import seal, unseal


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
            raise ConfigurationError(
                f"task file {str(path)!r} does not exist; give a .py file with plan() and execute()"
            )
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
                raise ConfigurationError(
                    f"task file {filename!r} has no {needed}() function; a task file defines "
                    "plan() (yields dicts with an 'id') and execute(item) (returns a dict)"
                )
        compute = getattr(module, "COMPUTE", None)
        if compute is not None and not isinstance(compute, Compute):
            raise ConfigurationError(f"{filename}: COMPUTE={compute!r} must be a sluice.Compute")
        return cls(filename, source, argv, module)

    def sealed(self, run_id: str, secret: str | None) -> dict[str, str]:
        """The fields the driver stores for the run's workers, signed with ``secret`` and naming the
        run, so a signed task file cannot be planted under another run's id."""
        return seal(
            secret, {"run": run_id, "filename": self.filename, "source": self.source, "argv": json.dumps(self.argv)}
        )

    @classmethod
    def unsealed(cls, run_id: str, stored: Mapping[bytes, bytes], secret: str | None) -> TaskFile:
        """The task file a worker loads from the fields stored for ``run_id``, once their signature
        holds; :class:`InvalidRequestError` naming what is wrong otherwise (nothing of it ran)."""
        what = f"the task file of batch run {run_id!r}"
        if not stored:
            raise InvalidRequestError(f"refusing {what}: Redis holds none (the run's keys expired or were deleted)")
        fields = unseal(
            secret, {k.decode(errors="replace"): v.decode(errors="replace") for k, v in stored.items()}, what
        )
        if fields.get("run") != run_id:
            raise InvalidRequestError(
                f"refusing {what}: it is signed for batch run {fields.get('run')!r}, not this "
                "one (copied from another run; nothing of it was run)"
            )
        return cls.from_source(fields["filename"], fields["source"], json.loads(fields["argv"]))

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
