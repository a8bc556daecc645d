"""CodeRepository: a validated graph of asset steps, and the driver that materializes it."""

from __future__ import annotations

import graphlib
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from sluice.assets.definition import Step
from sluice.assets.executors import Executor
from sluice.assets.result import (
    SKIPPED,
    SUCCEEDED,
    AssetResult,
    MaterializeResult,
    StepOutcome,
)
from sluice.errors import DefinitionError


class CodeRepository:
    """``CodeRepository(assets=[...], default_executor=Executor.kubernetes(...))``.

    The graph is checked here: a duplicate asset name, a dependency no asset produces, or a
    cycle raises :class:`DefinitionError` naming the assets involved.
    """

    def __init__(self, assets: Sequence[Step], default_executor: Executor | None = None) -> None:
        bad = [a for a in assets if not isinstance(a, Step)]
        if bad:
            raise DefinitionError(f"assets={bad!r}: each must be a function decorated with @Asset or @Asset.from_multi")
        self.steps = list(assets)
        self.default_executor = default_executor
        self.producer: dict[str, Step] = {}
        for step in self.steps:
            for name in step.outputs:
                if name in self.producer:
                    raise DefinitionError(
                        f"duplicate asset name {name!r}: produced by {self.producer[name].name} and {step.name}"
                    )
                self.producer[name] = step
        for step in self.steps:
            unknown = [d for d in step.deps if d not in self.producer]
            if unknown:
                raise DefinitionError(
                    f"asset {step.name} depends on {', '.join(map(repr, unknown))}, which no asset "
                    f"in this repository produces; known assets: {', '.join(sorted(self.producer))}"
                )
        self._order = self._topological(self.steps)

    def _topological(self, steps: Iterable[Step]) -> list[Step]:
        sorter: graphlib.TopologicalSorter[Step] = graphlib.TopologicalSorter()
        for step in steps:
            sorter.add(step, *(self.producer[d] for d in step.deps))
        try:
            return list(sorter.static_order())
        except graphlib.CycleError as err:
            cycle = " -> ".join(s.name for s in err.args[1])
            raise DefinitionError(f"the assets form a cycle: {cycle}") from None

    def plan(self, selection: Iterable[str] | None = None) -> list[Step]:
        """The steps that produce ``selection`` (all assets by default) and their upstreams, in order."""
        if selection is None:
            return list(self._order)
        unknown = [n for n in selection if n not in self.producer]
        if unknown:
            raise DefinitionError(
                f"selection names unknown assets {unknown}; known: {', '.join(sorted(self.producer))}"
            )
        needed: set[Step] = set()
        todo = [self.producer[n] for n in selection]
        while todo:
            step = todo.pop()
            if step not in needed:
                needed.add(step)
                todo.extend(self.producer[d] for d in step.deps)
        return [s for s in self._order if s in needed]

    def materialize(
        self,
        selection: Iterable[str] | None = None,
        executor: Executor | None = None,
        reuse: MaterializeResult | None = None,
    ) -> MaterializeResult:
        """Run the selected assets and their upstreams: dependency order, independent steps in
        parallel (as far as the executor allows). A failed step's downstream steps are skipped;
        the rest of the graph finishes. ``reuse`` takes succeeded assets from an earlier run."""
        executor = executor or self.default_executor or Executor.in_process()
        steps = self.plan(selection)
        executor.prepare(steps)
        run_id = uuid.uuid4().hex
        results: dict[str, AssetResult] = {}
        if reuse is not None:
            for step in steps:
                previous = [reuse.assets.get(n) for n in step.outputs]
                if all(p is not None and p.status == SUCCEEDED for p in previous):
                    results.update({p.name: p for p in previous if p is not None})
        remaining = [s for s in steps if s.outputs[0] not in results]
        with ThreadPoolExecutor(max_workers=executor.concurrency, thread_name_prefix="sluice-asset") as pool:
            running: dict[Future[StepOutcome], Step] = {}
            while remaining or running:
                for step in list(remaining):
                    upstream = [results.get(d) for d in step.deps]
                    if any(u is not None and u.status != SUCCEEDED for u in upstream):
                        blocker = next(u.name for u in upstream if u is not None and u.status != SUCCEEDED)
                        outcome = StepOutcome(SKIPPED, "", error=f"upstream asset {blocker} did not succeed")
                        self._record(results, step, outcome, run_id, executor)
                        remaining.remove(step)
                    elif all(u is not None for u in upstream):
                        inputs = {d: (results[d].run_id, d) for d in step.deps}
                        running[pool.submit(executor.run_step, step, run_id, inputs)] = step
                        remaining.remove(step)
                if not running:
                    continue
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    self._record(results, running.pop(future), future.result(), run_id, executor)
        return MaterializeResult(run_id, results, self, executor)

    @staticmethod
    def _record(
        results: dict[str, AssetResult], step: Step, outcome: StepOutcome, run_id: str, executor: Executor
    ) -> None:
        for name in step.outputs:
            results[name] = AssetResult(
                name, outcome.status, run_id, outcome.where, outcome.attempts, outcome.error, executor
            )
