"""Compute: construction, validation, inheritance, equality and repr."""

from __future__ import annotations

import pytest

from sluice import Compute
from sluice.errors import ConfigurationError


def test_canonical_values() -> None:
    c = Compute(cpu="4", memory="32Gi", gpu="1")
    assert (c.millicores, c.memory_bytes, c.gpu) == (4000, 32 << 30, 1)
    assert (c.cpu, c.memory) == ("4", "32Gi")


@pytest.mark.parametrize("gpu", [1, "1", " 2 ", 0])
def test_gpu_whole_counts(gpu: object) -> None:
    assert Compute(gpu=gpu).gpu == int(str(gpu).strip())


@pytest.mark.parametrize("gpu", [True, -1, "1.5", 1.5, "one", ""])
def test_gpu_rejects_non_counts(gpu: object) -> None:
    with pytest.raises(ConfigurationError, match="whole count"):
        Compute(gpu=gpu)


def test_bad_axis_fails_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="'32GB'"):
        Compute(memory="32GB")


def test_inherit_fills_only_unset_axes() -> None:
    default = Compute(cpu="1", memory="512Mi")
    assert Compute(memory="32Gi").inherit(default) == Compute(cpu="1", memory="32Gi")
    assert Compute(cpu="2").inherit(default) == Compute(cpu="2", memory="512Mi")
    assert Compute().inherit(default) == default
    assert Compute(gpu=1).inherit(default).gpu == 1


def test_equality_hash_and_equivalent_spellings() -> None:
    assert Compute(cpu="0.5") == Compute(cpu="500m")
    assert Compute(memory="1024Mi") == Compute(memory="1Gi")
    assert len({Compute(cpu="1"), Compute(cpu="1000m"), Compute(cpu="2")}) == 2
    assert Compute(cpu="1") != Compute(cpu="1", memory="1Gi")


def test_frozen() -> None:
    c = Compute(cpu="1")
    with pytest.raises(AttributeError, match="frozen"):
        c.millicores = 5  # type: ignore[misc]


def test_repr_in_kubernetes_units() -> None:
    assert repr(Compute(cpu="1.5", memory="32Gi", gpu=1)) == "Compute(cpu='1500m', memory='32Gi', gpu=1)"
    assert repr(Compute()) == "Compute()"


def test_fits_in_every_axis() -> None:
    slot = Compute(cpu="4", memory="64Gi", gpu=0)
    assert Compute(cpu="4", memory="64Gi").fits_in(slot)
    assert not Compute(cpu="5").fits_in(slot)
    assert not Compute(memory="65Gi").fits_in(slot)
    assert not Compute(gpu=1).fits_in(slot)


def test_dict_round_trip_and_unknown_axes() -> None:
    c = Compute(cpu="250m", memory="1G", gpu=2)
    assert Compute.from_dict(c.to_dict()) == c
    with pytest.raises(ConfigurationError, match="gpus"):
        Compute.from_dict({"gpus": 1})


def test_pickles() -> None:
    import pickle

    c = Compute(cpu="1500m", memory="3Gi", gpu=1)
    assert pickle.loads(pickle.dumps(c)) == c
