"""Seed 000's code samples, adapted only in names (rivers -> sluice); bodies return small values."""

import sluice as sl


@sl.Asset(compute=sl.Compute(cpu="4", memory="32Gi"))
def skewed_join(ctx):
    return {"asset": ctx.asset_name, "compute": ctx.compute.to_dict()}


@sl.Asset(compute=sl.Compute(memory="32Gi"))    # cpu stays "1"
def big(ctx):
    return {"asset": ctx.asset_name, "compute": ctx.compute.to_dict()}


@sl.Asset(compute=sl.Compute(gpu="1", memory="16Gi"))
def train(ctx):
    return {"asset": ctx.asset_name, "compute": ctx.compute.to_dict()}


@sl.Asset(
    compute=sl.Compute(memory="8Gi"),
    retry=sl.RetryPolicy(
        max_retries=3,
        retry_on=sl.RetryOn.TRANSIENT,
        escalate=sl.ComputeEscalation(factor=2.0, max_memory="64Gi"),
    ),
)
def sometimes_bigger(ctx):    # 8Gi → 16Gi → 32Gi → 64Gi
    return {"asset": ctx.asset_name, "attempt": ctx.attempt}


@sl.Asset.from_multi(
    output_defs=[sl.AssetDef("orders"), sl.AssetDef("customers")],
    compute=sl.Compute(memory="8Gi"),
)
def load_tables():
    return {"orders": [1, 2, 3], "customers": ["ann", "bo"]}


@sl.Asset()
def report(orders, customers, skewed_join):
    return f"{len(orders)} orders from {len(customers)} customers; join ran as {skewed_join['compute']}"


ASSETS = [skewed_join, big, train, sometimes_bigger, load_tables, report]


def repository(executor: sl.Executor) -> sl.CodeRepository:
    return sl.CodeRepository(assets=ASSETS, default_executor=executor)
