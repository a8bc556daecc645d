"""The task every sluice worker has for asset steps: import the step, load inputs, run, store outputs.

Its arguments name a module to import and a path to write under, so they are signed like the
values (:func:`step_signature`): a worker imports nothing for a message a holder of the secret
did not send.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from sluice.assets.context import AssetContext
from sluice.assets.definition import Step
from sluice.assets.store import RedisStore
from sluice.compute import Compute
from sluice.errors import DefinitionError
from sluice.signing import SIGNATURE, seal, unseal
from sluice.tasks.escalation import Attempt

RUN_STEP_TASK = "sluice.assets.run_step"


def call_step(step: Step, run_id: str, values: dict[str, Any], attempt: int, compute: Compute) -> dict[str, Any]:
    """Call the step's function with its upstream values (and ctx) and split its outputs: here,
    and by the in-process and parallel executors."""
    kwargs = dict(values)
    if step.takes_ctx:
        kwargs["ctx"] = AssetContext.create(run_id, step.name, attempt, compute)
    return step.split(step.fn(**kwargs))


def load_step(ref: str) -> Step:
    """``module:qualname`` -> the Step object the module defines."""
    module_name, _, qualname = ref.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if not isinstance(target, Step):
        raise DefinitionError(f"{ref} is not an asset step on this worker (is its module the same version here?)")
    return target


def _step_fields(ref: str, run_id: str, inputs: dict[str, list[str]], store_path: str) -> dict[str, Any]:
    return {"ref": ref, "run_id": run_id, "inputs": inputs, "store_path": store_path}


def step_signature(secret: str | None, ref: str, run_id: str, inputs: dict[str, list[str]], store_path: str) -> str:
    """The ``sig`` keyword a ``RUN_STEP_TASK`` message carries: the HMAC of its arguments."""
    return str(seal(secret, _step_fields(ref, run_id, inputs, store_path))[SIGNATURE])


def run_step(
    task: Any, ref: str, run_id: str, inputs: dict[str, list[str]], store_path: str, sig: str | None = None
) -> dict[str, Any]:
    """Bound Celery task body (registered by every sluice App under ``RUN_STEP_TASK``); refuses,
    before importing anything, arguments whose ``sig`` does not hold."""
    secret = task.app.settings.signing_secret()
    unseal(secret, {**_step_fields(ref, run_id, inputs, store_path), SIGNATURE: sig}, f"asset step {ref!r}")
    step = load_step(ref)
    request = task.request
    attempt = Attempt.of(task, request, request.delivery_info)
    store = RedisStore(task.app.redis, Path(store_path), secret)
    values = {param: store.get(run, asset) for param, (run, asset) in inputs.items()}
    for asset, value in call_step(step, run_id, values, attempt.number, attempt.compute).items():
        store.put(run_id, asset, value)
    return {"queue": attempt.queue, "worker": task.app.node_name(request), "attempt": attempt.number}
