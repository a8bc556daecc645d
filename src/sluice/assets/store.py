"""Where asset values live between steps.

On workers (``Executor.kubernetes``) values must reach a step on another machine, so they go
through Redis, and values larger than ``inline_limit`` bytes go to a file under ``path`` (a
volume or mount every worker shares) with only a pointer in Redis. Values are pickled with
cloudpickle and signed with the shared secret (:mod:`sluice.signing`): whoever can write to
Redis or the shared path but lacks the secret cannot make a worker unpickle anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import cloudpickle
import redis

from sluice import entries, keys
from sluice.errors import ValueMissing
from sluice.signing import sign, verify

#: Values kept in Redis for a week: long enough to re-materialize a failed part of a run.
VALUE_TTL = 7 * 24 * 3600
_POINTER = b"file:"


class Store(Protocol):
    def put(self, run_id: str, asset: str, value: Any) -> None: ...

    def get(self, run_id: str, asset: str) -> Any: ...


class MemoryStore:
    """For executors that run in this process or its children: values stay in the driver."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, str], Any] = {}

    def put(self, run_id: str, asset: str, value: Any) -> None:
        self._values[(run_id, asset)] = value

    def get(self, run_id: str, asset: str) -> Any:
        return self._values[(run_id, asset)]


class RedisStore:
    """Small values inline in Redis, large ones in files under a shared path."""

    def __init__(self, client: redis.Redis, path: Path, secret: str | None, inline_limit: int = 1 << 20) -> None:
        self.client = client
        self.path = Path(path)
        self.secret = secret
        self.inline_limit = inline_limit

    def put(self, run_id: str, asset: str, value: Any) -> None:
        data = sign(self.secret, cloudpickle.dumps(value))
        if len(data) > self.inline_limit:
            target = self.path / run_id / f"{asset}.pickle"
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
            data = _POINTER + str(target).encode()
        self.client.set(keys.asset_value(run_id, asset), data, ex=VALUE_TTL)

    def get(self, run_id: str, asset: str) -> Any:
        data = self.client.get(keys.asset_value(run_id, asset))
        if data is None:
            raise ValueMissing(f"no stored value for asset {asset!r} of run {run_id} (expired, or never materialized)")
        data = entries.blob(data)
        if data.startswith(_POINTER):
            data = Path(data[len(_POINTER) :].decode()).read_bytes()
        return cloudpickle.loads(verify(self.secret, data, f"the value of asset {asset!r} of run {run_id}"))
