"""Assets on the small test ladder (small 150Mi, medium 300Mi, large 600Mi): routing and escalation."""

import sluice as sl
from tests.apps.ladder import app

MiB = 1 << 20


def _count(ctx) -> None:
    app.redis.incr(f"test:asset-runs:{ctx.run_id}:{ctx.asset_name}")


@sl.Asset(compute=sl.Compute(memory="100Mi"))
def source(ctx):
    _count(ctx)
    return list(range(10))


@sl.Asset(compute=sl.Compute(memory="250Mi"))     # above the small class: runs on medium
def wide(ctx, source):
    _count(ctx)
    return {"total": sum(source), "compute": ctx.compute.to_dict()}


@sl.Asset(compute=sl.Compute(memory="150Mi"),
          retry=sl.RetryPolicy(max_retries=2, retry_on=sl.RetryOn.OOM,
                               escalate=sl.ComputeEscalation(factor=2.0, max_memory="600Mi")))
def hungry(ctx, source):
    """Needs ~200MiB: killed at 150Mi on small, succeeds at 300Mi on medium."""
    _count(ctx)
    block = bytearray(200 * MiB)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return {"attempt": ctx.attempt, "memory": ctx.compute.memory, "n": len(source)}


@sl.Asset()
def combined(ctx, wide, hungry):
    _count(ctx)
    return {"wide": wide["total"], "hungry_attempt": hungry["attempt"]}


repo = sl.CodeRepository(assets=[source, wide, hungry, combined],
                         default_executor=sl.Executor.kubernetes(worker_cpu="1", worker_memory="100Mi", app=app))
