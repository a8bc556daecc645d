"""Assets: a small DAG of steps, each with its own compute (see the README's Assets section)."""

from sluice.assets.definition import Asset, AssetDef, Step
from sluice.assets.executors import Executor
from sluice.assets.repository import CodeRepository
from sluice.assets.result import AssetResult, MaterializeResult

__all__ = ["Asset", "AssetDef", "Step", "Executor", "CodeRepository", "AssetResult", "MaterializeResult"]
