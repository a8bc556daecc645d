"""What a materialization returns: each asset's status, attempts, where it ran, and its value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.errors import ValueMissing

if TYPE_CHECKING:
    from sluice.assets.executors import Executor
    from sluice.assets.repository import CodeRepository

SUCCEEDED, FAILED, SKIPPED = "succeeded", "failed", "skipped"


@dataclass
class StepOutcome:
    """How one step ended (returned by an executor; never raises)."""

    status: str
    where: str
    attempts: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


@dataclass
class AssetResult:
    """One asset of a run. ``value`` is read from the run's store when asked for."""

    name: str
    status: str
    run_id: str
    where: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    executor: Executor | None = field(default=None, repr=False)

    @property
    def value(self) -> Any:
        if self.status != SUCCEEDED or self.executor is None:
            raise ValueMissing(
                f"asset {self.name} has no value: it {self.status}" + (f" ({self.error})" if self.error else "")
            )
        return self.executor.store.get(self.run_id, self.name)


@dataclass
class MaterializeResult:
    run_id: str
    assets: dict[str, AssetResult]
    repository: CodeRepository = field(repr=False)
    executor: Executor = field(repr=False)

    @property
    def success(self) -> bool:
        return all(a.status == SUCCEEDED for a in self.assets.values())

    @property
    def failed(self) -> list[str]:
        return sorted(n for n, a in self.assets.items() if a.status == FAILED)

    @property
    def skipped(self) -> list[str]:
        return sorted(n for n, a in self.assets.items() if a.status == SKIPPED)

    def value(self, name: str) -> Any:
        return self.assets[name].value

    def rerun_failed(self) -> MaterializeResult:
        """Materialize only what failed or was skipped, reusing every value this run produced."""
        return self.repository.materialize(selection=self.failed + self.skipped, executor=self.executor, reuse=self)
