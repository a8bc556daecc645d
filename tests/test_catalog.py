"""Resource classes: the default ladder, routing to the smallest fit, config merges."""

from __future__ import annotations

import pytest

from sluice import Catalog, Compute, ResourceClass
from sluice.errors import ConfigurationError, NoQueueFits

DEFAULT = Catalog.merged({})


@pytest.mark.parametrize(("compute", "queue"), [
    (Compute(cpu="1", memory="512Mi"), "cpu"),
    (Compute(cpu="1", memory="2Gi"), "cpu"),
    (Compute(cpu="1", memory="3Gi"), "highmem"),
    (Compute(cpu="2", memory="512Mi"), "highmem"),
    (Compute(cpu="1", memory="64Gi"), "highmem"),
    (Compute(cpu="1", memory="8Gi", gpu=1), "gpu"),
    (Compute(cpu="8", memory="64Gi", gpu="1"), "gpu"),
])
def test_smallest_class_that_fits(compute: Compute, queue: str) -> None:
    assert DEFAULT.route(compute).name == queue


def test_reference_escalation_ladder_fits_defaults() -> None:
    base = Compute(cpu="1", memory="8Gi")
    for memory in ("8Gi", "16Gi", "32Gi", "64Gi"):
        assert DEFAULT.route(base.replace(memory_bytes=Compute(memory=memory).memory_bytes)).name == "highmem"


def test_non_gpu_task_never_lands_on_gpu_class() -> None:
    catalog = Catalog([ResourceClass("small", Compute(cpu="1", memory="1Gi")),
                       ResourceClass("gpu", Compute(cpu="64", memory="1Ti", gpu=8))])
    with pytest.raises(NoQueueFits):
        catalog.route(Compute(cpu="2", memory="2Gi"))


def test_no_queue_fits_names_task_compute_and_every_class() -> None:
    with pytest.raises(NoQueueFits) as err:
        DEFAULT.route(Compute(cpu="1", memory="128Gi"), "etl.giant_join")
    message = str(err.value)
    assert "etl.giant_join" in message and "memory='128Gi'" in message
    for part in ("cpu (cpu=1 memory=2Gi gpu=0)", "highmem (cpu=4 memory=64Gi gpu=0)", "gpu (cpu=8 memory=64Gi gpu=1)"):
        assert part in message


def test_merge_overrides_adds_and_disables() -> None:
    catalog = Catalog.merged({"highmem": {"memory": "128Gi"}, "tiny": {"cpu": "250m", "memory": "256Mi", "slots": 8},
                              "gpu": {"enabled": False}})
    assert catalog.names == ["tiny", "cpu", "highmem"]
    assert catalog.get("highmem").slot == Compute(cpu="4", memory="128Gi", gpu=0)
    assert catalog.get("tiny").slots == 8
    assert catalog.route(Compute(cpu="100m", memory="100Mi")).name == "tiny"


@pytest.mark.parametrize(("table", "match"), [
    ({"x": {"cpu": "1"}}, "needs both cpu and memory"),
    ({"x": {"cpu": "1", "memory": "1Gi", "slot": 2}}, "unknown keys \\['slot'\\]"),
    ({"x": {"cpu": "1", "memory": "1Gi", "slots": 0}}, "slots=0"),
    ({"x": {"cpu": "1", "memory": "1Gi", "min_replicas": 5, "max_replicas": 2}}, "exceeds max_replicas"),
    ({"bad name": {"cpu": "1", "memory": "1Gi"}}, "'bad name' is not valid"),
    ({"x": "big"}, "must be a table"),
])
def test_bad_class_tables(table: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Catalog.merged(table)


def test_unknown_class_lists_configured_ones() -> None:
    with pytest.raises(ConfigurationError, match="configured classes: cpu, highmem, gpu"):
        DEFAULT.get("hugemem")


def test_duplicate_names_rejected() -> None:
    rc = ResourceClass("a", Compute(cpu="1", memory="1Gi"))
    with pytest.raises(ConfigurationError, match="repeated: a"):
        Catalog([rc, rc])
