"""Executors: where asset steps run.

* ``Executor.in_process()`` runs each step in this process, one at a time;
* ``Executor.parallel(workers=N)`` runs up to N steps at once in child processes;
* ``Executor.kubernetes(worker_cpu=..., worker_memory=...)`` sends every step to the workers as a
  Celery task, routed by its effective compute (unset axes inherit the executor's defaults),
  with its retry policy and escalation, and passes values through Redis (plus a shared path
  for large ones).

The first two have no per-step compute envelope: an asset's ``compute=`` logs a warning once and
is ignored, as in the reference.
"""

from __future__ import annotations

import multiprocessing
import traceback
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import cloudpickle

from sluice.app import App
from sluice.assets.definition import Step
from sluice.assets.result import FAILED, SUCCEEDED, StepOutcome
from sluice.assets.step_task import RUN_STEP_TASK, call_step, step_signature
from sluice.assets.store import MemoryStore, RedisStore, Store
from sluice.compute import Compute
from sluice.errors import DefinitionError
from sluice.headers import Headers
from sluice.tasks.history import attempts

Inputs = dict[str, tuple[str, str]]  # parameter -> (run id, asset name) in the store


class Executor(ABC):
    """Runs one step at a time per call to :meth:`run_step`; the repository drives the graph."""

    name = "executor"
    concurrency = 1
    store: Store

    @staticmethod
    def in_process() -> Executor:
        return InProcessExecutor()

    @staticmethod
    def parallel(workers: int = 2) -> Executor:
        return ParallelExecutor(workers)

    @staticmethod
    def kubernetes(
        worker_cpu: str = "1",
        worker_memory: str = "512Mi",
        app: App | None = None,
        store_path: str | Path | None = None,
        concurrency: int = 32,
        timeout: float = 24 * 3600,
    ) -> Executor:
        return KubernetesExecutor(worker_cpu, worker_memory, app, store_path, concurrency, timeout)

    def prepare(self, steps: Sequence[Step]) -> None:
        """Checks before anything runs (a step no class can hold fails the whole run up front)."""
        for step in steps:
            step.warn_no_envelope(self.name)

    @abstractmethod
    def run_step(self, step: Step, run_id: str, inputs: Inputs) -> StepOutcome:
        """Run one step to its end; store its outputs; never raise."""


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class InProcessExecutor(Executor):
    name = "in-process"

    def __init__(self) -> None:
        self.store = MemoryStore()

    def run_step(self, step: Step, run_id: str, inputs: Inputs) -> StepOutcome:
        try:
            values = {param: self.store.get(*ref) for param, ref in inputs.items()}
            for asset, value in call_step(step, run_id, values, 1, step.compute or Compute()).items():
                self.store.put(run_id, asset, value)
        except Exception as exc:
            return StepOutcome(FAILED, "in-process", [], _error(exc) + "\n" + traceback.format_exc())
        return StepOutcome(SUCCEEDED, "in-process")


def _run_pickled(payload: bytes) -> tuple[bool, Any]:
    """In a child process: run a cloudpickled (step, run_id, values) call; return (ok, outputs or error)."""
    step, run_id, values = cloudpickle.loads(payload)
    try:
        return True, cloudpickle.dumps(call_step(step, run_id, values, 1, step.compute or Compute()))
    except Exception as exc:
        return False, _error(exc) + "\n" + traceback.format_exc()


class ParallelExecutor(Executor):
    name = "parallel"

    def __init__(self, workers: int) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise DefinitionError(f"Executor.parallel(workers={workers!r}) needs a whole number of at least 1")
        self.concurrency = workers
        self.store = MemoryStore()
        self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))

    def run_step(self, step: Step, run_id: str, inputs: Inputs) -> StepOutcome:
        values = {param: self.store.get(*ref) for param, ref in inputs.items()}
        try:
            ok, out = self._pool.submit(_run_pickled, cloudpickle.dumps((step, run_id, values))).result()
        except Exception as exc:  # the child died, or the value could not be pickled
            return StepOutcome(FAILED, "parallel", [], _error(exc))
        if not ok:
            return StepOutcome(FAILED, "parallel", [], out)
        for asset, value in cloudpickle.loads(out).items():
            self.store.put(run_id, asset, value)
        return StepOutcome(SUCCEEDED, "parallel")


class KubernetesExecutor(Executor):
    """Every step is the built-in task ``sluice.assets.run_step``, routed by the step's compute."""

    name = "kubernetes"
    store: RedisStore  #: the workers read and write the step values too (signed with its secret)

    def __init__(
        self,
        worker_cpu: str,
        worker_memory: str,
        app: App | None,
        store_path: str | Path | None,
        concurrency: int,
        timeout: float,
    ) -> None:
        self.defaults = Compute(cpu=worker_cpu, memory=worker_memory)
        self.app = app or App.default()
        self.store_path = Path(store_path) if store_path else self.app.settings.home / "assets"
        self.store = RedisStore(self.app.redis, self.store_path, self.app.settings.signing_secret())
        self.concurrency = concurrency
        self.timeout = timeout

    def compute_of(self, step: Step) -> Compute:
        """The step's compute, each unset axis inherited from the executor's worker_cpu/worker_memory."""
        return (step.compute or Compute()).inherit(self.defaults)

    def prepare(self, steps: Sequence[Step]) -> None:
        for step in steps:
            if step.fn.__module__ == "__main__":
                raise DefinitionError(
                    f"asset {step.name} is defined in __main__; workers import assets by module, "
                    "so define it in an importable module to run it on Executor.kubernetes"
                )
            self.app.catalog.route(self.compute_of(step), f"asset {step.name}")
            if step.retry is not None:
                step.retry.check(self.compute_of(step), self.app.catalog, f"asset {step.name}")

    def run_step(self, step: Step, run_id: str, inputs: Inputs) -> StepOutcome:
        headers = Headers(compute=self.compute_of(step), policy=step.retry).encode()
        args = (step.ref, run_id, {p: list(ref) for p, ref in inputs.items()}, str(self.store_path))
        result = self.app.tasks[RUN_STEP_TASK].apply_async(
            args=args, kwargs={"sig": step_signature(self.store.secret, *args)}, headers=headers
        )
        try:
            out = result.get(timeout=self.timeout, propagate=False)
        except Exception as exc:  # timed out, or the backend is gone
            return StepOutcome(FAILED, "?", attempts(result), _error(exc))
        history = attempts(result)
        if result.successful():
            return StepOutcome(SUCCEEDED, f"{out['queue']} ({out['worker']})", history)
        where = history[-1]["queue"] if history else "?"
        return StepOutcome(FAILED, where, history, f"{type(out).__name__}: {out}")
