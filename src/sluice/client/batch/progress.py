"""What a batch run shows while it goes and writes to checkpoint.json, its settings and exit codes."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: ``sluice compute`` exits 0 when every item succeeded, 1 when some failed, 130 when interrupted,
#: 75 (EX_TEMPFAIL) when it lost the broker for longer than sluice waits out an outage: nothing
#: failed, run it again with ``--resume``.
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_BROKER_LOST = 0, 1, 130, 75


@dataclass(frozen=True)
class RunSettings:
    """How the driver runs: the run's name and queue, retries, the in-flight window and chunk cap,
    quarantine after N infrastructure failures, whether resume re-runs failed ids, and the
    tenant its chunks belong to (None: as any call finds its tenant, ``sluice.tenants``)."""

    run_id: str
    queue: str
    retries: int = 0
    window: int = 20_000
    max_chunk: int = 1_000
    quarantine_after: int = 3
    rerun_failed: bool = False
    tenant: str | None = None


@dataclass
class Progress:
    """Counts a run shows while it goes and writes to checkpoint.json."""

    started: float = field(default_factory=time.time)
    ok: int = 0
    failed: int = 0
    cancelled: int = 0
    skipped: int = 0
    duplicates: int = 0
    dispatched: int = 0
    in_flight: int = 0
    plan_done: bool = False
    per_worker: Counter[str] = field(default_factory=Counter)
    quarantined: list[str] = field(default_factory=list)

    @property
    def finished(self) -> int:
        return self.ok + self.failed + self.cancelled

    def rate(self) -> float:
        return self.finished / max(time.time() - self.started, 1e-9)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "skipped": self.skipped,
            "duplicates": self.duplicates,
            "dispatched": self.dispatched,
            "in_flight": self.in_flight,
            "plan_done": self.plan_done,
            "items_per_s": round(self.rate(), 1),
            "elapsed_s": round(time.time() - self.started, 3),
            "per_worker": dict(self.per_worker),
            "quarantined": self.quarantined,
            "updated": time.time(),
        }
