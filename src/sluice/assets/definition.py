"""Asset definitions: ``@Asset(...)`` and ``@Asset.from_multi(...)`` turn a function into a Step.

A step is one unit of execution (one Celery task, one pod in the reference's model) producing
one asset, or several for a multi-asset. Its dependencies are its parameter names (other than
``ctx``), matched to other assets' names.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.compute import Compute
from sluice.errors import DefinitionError
from sluice.tasks.retry import RetryPolicy

log = logging.getLogger("sluice.assets")

CONTEXT_PARAMETER = "ctx"


@dataclass(frozen=True)
class AssetDef:
    """One output of a multi-asset. Compute belongs to the step, so it is rejected here."""

    name: str
    compute: Compute | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise DefinitionError(
                f"AssetDef name {self.name!r} must be a Python identifier (it is a parameter name downstream)"
            )
        if self.compute is not None:
            raise DefinitionError(
                f"AssetDef({self.name!r}, compute=...) is not supported: a multi-asset is one step (one pod), so "
                "declare compute on Asset.from_multi(compute=...) itself"
            )


@dataclass(eq=False)
class Step:
    """What ``@Asset`` returns: the function plus its outputs, dependencies, compute and policy."""

    fn: Callable[..., Any]
    outputs: tuple[str, ...]
    compute: Compute | None
    retry: RetryPolicy | None
    multi: bool = False
    deps: tuple[str, ...] = field(init=False)
    takes_ctx: bool = field(init=False)
    _warned: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        params = list(inspect.signature(self.fn).parameters.values())
        bad = [p.name for p in params if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if bad:
            raise DefinitionError(
                f"asset {self.name}: parameters {bad} must be plain named parameters (one per "
                "upstream asset, plus an optional ctx)"
            )
        self.takes_ctx = any(p.name == CONTEXT_PARAMETER for p in params)
        self.deps = tuple(p.name for p in params if p.name != CONTEXT_PARAMETER)

    @property
    def name(self) -> str:
        """The step's name: the function's name (for a multi-asset, its outputs are named apart)."""
        return self.fn.__name__

    @property
    def ref(self) -> str:
        """``module:qualname``: how a worker finds this step by importing its module."""
        return f"{self.fn.__module__}:{self.fn.__qualname__}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the step calls the function, so assets stay testable as plain functions."""
        return self.fn(*args, **kwargs)

    def split(self, value: Any) -> dict[str, Any]:
        """The step's return value as {asset name: value} (a multi-asset returns a dict or a tuple)."""
        if not self.multi:
            return {self.outputs[0]: value}
        if isinstance(value, dict) and set(value) == set(self.outputs):
            return dict(value)
        if isinstance(value, tuple) and len(value) == len(self.outputs):
            return dict(zip(self.outputs, value))
        shape = sorted(value) if isinstance(value, dict) else f"{type(value).__name__} of {_len(value)}"
        raise DefinitionError(
            f"multi-asset {self.name} returned {shape}; it must return a dict with keys "
            f"{list(self.outputs)} or a tuple of {len(self.outputs)} values in that order"
        )

    def warn_no_envelope(self, executor: str) -> None:
        """In-process executors cannot size a step: say so once per asset."""
        if (self.compute is not None or self.retry is not None) and not self._warned:
            self._warned = True
            log.warning(
                "asset %s declares %s; the %s executor has no per-step compute envelope, so it is "
                "ignored (it applies on Executor.kubernetes)",
                self.name,
                self.compute.describe() if self.compute else "a retry policy",
                executor,
            )


def _len(value: Any) -> str:
    try:
        return str(len(value))
    except TypeError:
        return "1"


def _check(compute: Compute | None, retry: RetryPolicy | None) -> None:
    if compute is not None and not isinstance(compute, Compute):
        raise DefinitionError(f"compute={compute!r} must be a sluice.Compute, e.g. Compute(memory='8Gi')")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise DefinitionError(f"retry={retry!r} must be a sluice.RetryPolicy")


class Asset:
    """``@Asset(compute=Compute(memory="32Gi"), retry=RetryPolicy(...))`` on ``def name(ctx, upstream): ...``."""

    def __init__(self, compute: Compute | None = None, retry: RetryPolicy | None = None) -> None:
        _check(compute, retry)
        self.compute = compute
        self.retry = retry

    def __call__(self, fn: Callable[..., Any]) -> Step:
        return Step(fn, (fn.__name__,), self.compute, self.retry)

    @staticmethod
    def from_multi(
        output_defs: Sequence[AssetDef], compute: Compute | None = None, retry: RetryPolicy | None = None
    ) -> Callable[[Callable[..., Any]], Step]:
        """One step producing several assets, named by ``output_defs``; compute is the step's."""
        _check(compute, retry)
        if not output_defs or not all(isinstance(d, AssetDef) for d in output_defs):
            raise DefinitionError(f"output_defs={output_defs!r} must be a non-empty list of AssetDef")
        names = tuple(d.name for d in output_defs)
        if len(set(names)) != len(names):
            raise DefinitionError(f"output_defs repeat names: {sorted({n for n in names if names.count(n) > 1})}")

        def decorate(fn: Callable[..., Any]) -> Step:
            return Step(fn, names, compute, retry, multi=True)

        return decorate
