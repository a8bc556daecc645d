"""What an asset function sees as ``ctx``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sluice.compute import Compute


@dataclass(frozen=True)
class AssetContext:
    """The run, the step, which attempt this is, the compute it runs with, and a logger."""

    run_id: str
    asset_name: str
    attempt: int
    compute: Compute
    log: logging.LoggerAdapter[logging.Logger] = field(repr=False)

    @classmethod
    def create(cls, run_id: str, asset_name: str, attempt: int, compute: Compute) -> AssetContext:
        adapter = logging.LoggerAdapter(
            logging.getLogger(f"sluice.assets.{asset_name}"),
            {"run_id": run_id, "asset": asset_name, "attempt": attempt},
        )
        return cls(run_id, asset_name, attempt, compute, adapter)
