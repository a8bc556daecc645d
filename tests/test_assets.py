"""Assets: graph validation, the in-process and parallel executors, failure semantics, re-runs."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

import sluice as sl
from sluice.errors import DefinitionError
from tests.apps import reference_assets


def test_reference_samples_run_in_process_with_one_warning_per_asset(caplog: pytest.LogCaptureFixture) -> None:
    repo = reference_assets.repository(sl.Executor.in_process())
    with caplog.at_level(logging.WARNING, logger="sluice.assets"):
        first = repo.materialize()
        repo.materialize()
    assert first.success, first.assets
    assert first.value("report") == "3 orders from 2 customers; join ran as {'cpu': '4', 'memory': '32Gi'}"
    warned = [r.getMessage() for r in caplog.records if "no per-step compute envelope" in r.getMessage()]
    assert sorted(w.split()[1] for w in warned) == ["big", "load_tables", "skewed_join", "sometimes_bigger", "train"]
    assert {a.where for a in first.assets.values()} == {"in-process"}


def test_reference_samples_run_in_parallel() -> None:
    result = reference_assets.repository(sl.Executor.parallel(workers=2)).materialize()
    assert result.success
    assert result.value("orders") == [1, 2, 3] and result.value("customers") == ["ann", "bo"]
    assert result.value("sometimes_bigger") == {"asset": "sometimes_bigger", "attempt": 1}


def _diamond(log: Path) -> list[sl.assets.Step]:
    def mark(name: str) -> None:
        with open(log, "a") as out:
            out.write(f"{name} {os.getpid()}\n")

    @sl.Asset()
    def top(ctx):
        mark("top")
        return 1

    @sl.Asset()
    def left(top):
        mark("left")
        return top + 10

    @sl.Asset()
    def right(top):
        mark("right")
        return top + 100

    @sl.Asset()
    def bottom(left, right):
        mark("bottom")
        return left + right

    return [bottom, right, left, top]   # any order: the graph decides


@pytest.mark.parametrize("executor", [sl.Executor.in_process, lambda: sl.Executor.parallel(workers=2)],
                         ids=["in_process", "parallel"])
def test_diamond_runs_each_step_exactly_once(tmp_path: Path, executor: object) -> None:
    log = tmp_path / "runs.log"
    result = sl.CodeRepository(_diamond(log)).materialize(executor=executor())  # type: ignore[operator]
    assert result.value("bottom") == 112
    runs = log.read_text().split("\n")[:-1]
    assert sorted(line.split()[0] for line in runs) == ["bottom", "left", "right", "top"]
    assert runs[0].startswith("top") and runs[-1].startswith("bottom")


def test_a_failed_step_skips_downstream_and_the_rest_finishes_then_rerun_only_that(tmp_path: Path) -> None:
    calls: list[str] = []
    broken = {"yes": True}

    @sl.Asset()
    def raw():
        calls.append("raw")
        return [3, 1, 2]

    @sl.Asset()
    def cleaned(raw):
        calls.append("cleaned")
        if broken["yes"]:
            raise ValueError("bad row 2")
        return sorted(raw)

    @sl.Asset()
    def published(cleaned):
        calls.append("published")
        return len(cleaned)

    @sl.Asset()
    def side(raw):
        calls.append("side")
        return max(raw)

    first = sl.CodeRepository([raw, cleaned, published, side]).materialize()
    assert (first.assets["cleaned"].status, first.assets["published"].status) == ("failed", "skipped")
    assert "ValueError: bad row 2" in first.assets["cleaned"].error
    assert first.value("side") == 3 and first.failed == ["cleaned"] and first.skipped == ["published"]
    assert "published" not in calls
    with pytest.raises(LookupError, match="skipped"):
        first.value("published")

    broken["yes"] = False
    calls.clear()
    second = first.rerun_failed()
    assert second.success and second.value("published") == 3
    assert calls == ["cleaned", "published"]          # raw and side were not recomputed


def test_multi_asset_dict_or_tuple_and_a_wrong_shape() -> None:
    @sl.Asset.from_multi(output_defs=[sl.AssetDef("a"), sl.AssetDef("b")])
    def as_tuple():
        return 1, 2

    @sl.Asset.from_multi(output_defs=[sl.AssetDef("c"), sl.AssetDef("d")])
    def wrong():
        return {"c": 1}

    result = sl.CodeRepository([as_tuple, wrong]).materialize()
    assert (result.value("a"), result.value("b")) == (1, 2)
    assert "must return a dict with keys ['c', 'd']" in result.assets["c"].error


def test_context_fields(tmp_path: Path) -> None:
    @sl.Asset(compute=sl.Compute(memory="1Gi"))
    def probe(ctx):
        ctx.log.info("hello")
        return (ctx.run_id, ctx.asset_name, ctx.attempt, ctx.compute)

    result = sl.CodeRepository([probe]).materialize()
    assert result.value("probe") == (result.run_id, "probe", 1, sl.Compute(memory="1Gi"))


def test_selection_runs_the_asset_and_its_upstreams_only() -> None:
    repo = reference_assets.repository(sl.Executor.in_process())
    result = repo.materialize(selection=["report"])
    assert sorted(result.assets) == ["customers", "orders", "report", "skewed_join"]


# --- graph validation -------------------------------------------------------------------------

def _asset(name: str, *deps: str) -> sl.assets.Step:
    fn = eval(f"lambda {', '.join(deps)}: None")  # a function whose parameters are the deps
    fn.__name__ = fn.__qualname__ = name
    return sl.Asset()(fn)


def test_unknown_dependency_is_named() -> None:
    with pytest.raises(DefinitionError, match=r"asset join depends on 'ordrs', which no asset .* known assets: join, orders"):
        sl.CodeRepository([_asset("orders"), _asset("join", "ordrs")])


def test_cycle_is_named() -> None:
    with pytest.raises(DefinitionError, match="cycle: (a -> b -> c -> a|b -> c -> a -> b|c -> a -> b -> c)"):
        sl.CodeRepository([_asset("a", "c"), _asset("b", "a"), _asset("c", "b")])


def test_duplicate_names_are_named() -> None:
    with pytest.raises(DefinitionError, match="duplicate asset name 'x'"):
        sl.CodeRepository([_asset("x"), _asset("x")])
    multi = sl.Asset.from_multi(output_defs=[sl.AssetDef("orders")])(lambda: None)
    with pytest.raises(DefinitionError, match="duplicate asset name 'orders'"):
        sl.CodeRepository([_asset("orders"), multi])


def test_per_output_compute_is_rejected() -> None:
    with pytest.raises(DefinitionError, match=r"declare compute on Asset.from_multi\(compute=...\)"):
        sl.AssetDef("orders", compute=sl.Compute(memory="8Gi"))


@pytest.mark.parametrize(("make", "match"), [
    (lambda: sl.Asset(compute={"memory": "8Gi"}), "must be a sluice.Compute"),
    (lambda: sl.Asset(retry=3), "must be a sluice.RetryPolicy"),
    (lambda: sl.Asset.from_multi(output_defs=[]), "non-empty list of AssetDef"),
    (lambda: sl.Asset.from_multi(output_defs=[sl.AssetDef("a"), sl.AssetDef("a")]), "repeat names"),
    (lambda: sl.AssetDef("not a name"), "identifier"),
    (lambda: sl.CodeRepository([print]), "decorated with @Asset"),
    (lambda: sl.CodeRepository([_asset("a")]).plan(["b"]), "unknown assets \\['b'\\]"),
    (lambda: sl.Executor.parallel(workers=0), "at least 1"),
])
def test_bad_definitions(make: object, match: str) -> None:
    with pytest.raises(DefinitionError, match=match):
        make()  # type: ignore[operator]
