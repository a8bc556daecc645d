"""``sluice compute`` under torchrun: rank 0 drives, every rank works.

torchrun starts the same command once per rank with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set. Rank 0 starts the embedded Redis (unless a broker is
given), names the run, and tells the other ranks where it is through torch's own rendezvous
store (the one ``init_process_group`` would use; with ``--broker`` and no torch, through Redis).
Every rank then runs local workers on the run's private queue, so ``execute()`` runs in every
rank and sees that rank's ``LOCAL_RANK`` (e.g. to pick a GPU). Rank 0 drives and writes the
sink; when the run ends it records the exit code, and the other ranks stop their workers and
exit with the same code.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis

from sluice import keys, redis_client
from sluice.errors import ConfigurationError
from sluice.keys import RunPart

RENDEZVOUS_TIMEOUT = 300.0
#: Key (in torch's store, or in Redis with --broker) under which rank 0 shares the run.
SHARED = "sluice/run"


@dataclass(frozen=True)
class Ranks:
    """This process's place in a torchrun launch."""

    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    launch_id: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Ranks | None:
        """The launch torchrun describes in the environment, or None outside torchrun."""
        env = os.environ if env is None else env
        if "RANK" not in env or "WORLD_SIZE" not in env:
            return None
        try:
            rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"]))
        except ValueError:
            raise ConfigurationError(
                f"RANK={env['RANK']!r} and WORLD_SIZE={env['WORLD_SIZE']!r} must be whole numbers "
                "(as torchrun sets them)"
            ) from None
        master = env.get("MASTER_ADDR", "127.0.0.1")
        launch = env.get("TORCHELASTIC_RUN_ID") or f"{master}:{env.get('MASTER_PORT', '')}"
        return cls(rank, local, world, master, launch)

    @property
    def drives(self) -> bool:
        return self.rank == 0

    @property
    def bind_address(self) -> str:
        """Where rank 0's embedded Redis listens: loopback when every rank is on this machine."""
        return "127.0.0.1" if self.master_addr in ("127.0.0.1", "localhost") else "0.0.0.0"


def share_run(ranks: Ranks, run: dict[str, Any] | None, broker: str | None) -> dict[str, Any]:
    """Rank 0 passes ``run`` (broker URL, run id, queue); every rank returns it."""
    if broker is not None:
        return _share_through_redis(ranks, run, broker)
    try:
        import torch.distributed as dist
    except ImportError:
        raise ConfigurationError(
            "under torchrun without torch installed, pass --broker URL (a Redis every rank "
            "can reach) so the ranks can find each other"
        ) from None
    store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT)))
    store = dist.PrefixStore("sluice", store)
    if ranks.drives:
        store.set(SHARED, json.dumps(run))
        # wait until every rank has read it: a store rank 0 hosts must outlive their reads
        while store.add("acks", 0) < ranks.world_size - 1:
            time.sleep(0.05)
        return dict(run or {})
    shared = json.loads(store.get(SHARED))
    store.add("acks", 1)
    return dict(shared)


def _share_through_redis(ranks: Ranks, run: dict[str, Any] | None, broker: str) -> dict[str, Any]:
    client = redis_client.connect(broker)
    key = f"{keys.PREFIX}torchrun:{ranks.launch_id}"
    if ranks.drives:
        client.set(key, json.dumps(run), ex=24 * 3600)
        return dict(run or {})
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT
    while (raw := client.get(key)) is None:
        if time.monotonic() > deadline:
            raise ConfigurationError(
                f"rank {ranks.rank}: rank 0 did not announce the run within "
                f"{RENDEZVOUS_TIMEOUT:.0f}s (launch {ranks.launch_id})"
            )
        time.sleep(0.1)
    return dict(json.loads(raw))


def reset(client: redis.Redis, run_id: str) -> None:
    """Rank 0, before announcing the run: forget how an earlier run of the same id ended (resume)."""
    client.delete(keys.run(run_id, RunPart.FINISHED), keys.run(run_id, RunPart.RANKS_LEFT))


def release(client: redis.Redis, ranks: Ranks, run_id: str, code: int, timeout: float = 30.0) -> None:
    """Rank 0: record that the run is over (the other ranks exit with ``code``) and wait, bounded,
    until they have heard it, so that stopping the embedded Redis does not cut them off first."""
    client.set(keys.run(run_id, RunPart.FINISHED), code, ex=24 * 3600)
    deadline = time.monotonic() + timeout
    while int(client.get(keys.run(run_id, RunPart.RANKS_LEFT)) or 0) < ranks.world_size - 1:
        if time.monotonic() > deadline:
            return
        time.sleep(0.1)


def finished(client: redis.Redis, run_id: str) -> int | None:
    """The exit code rank 0 recorded, or None while the run goes on."""
    value = client.get(keys.run(run_id, RunPart.FINISHED))
    return None if value is None else int(value)


def leave(client: redis.Redis, run_id: str) -> None:
    """A rank other than 0 has seen the end of the run and stopped its workers."""
    client.incr(keys.run(run_id, RunPart.RANKS_LEFT))
