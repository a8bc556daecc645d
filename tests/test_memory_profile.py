"""Observed memory as pure functions: histogram buckets, tidy sizes, the learned size, and
``Compute(memory="auto")``."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice import Compute
from sluice.errors import ConfigurationError
from sluice.tasks.memory_profile import (
    MemoryProfile,
    bucket,
    bucket_top,
    learned_memory,
    tidy,
)

MiB = 1 << 20


@given(st.integers(min_value=1, max_value=1 << 44))
def test_a_bucket_holds_its_size_and_reads_at_most_9_percent_high(size: int) -> None:
    top = bucket_top(bucket(size))
    assert top >= size and (size < MiB or top <= size * 2 ** (1 / 8) + 1)


@pytest.mark.parametrize(("size", "tidied"), [(201 * MiB, 208 * MiB), (200 * MiB, 200 * MiB), (128 * MiB, 128 * MiB),
                                              (1, MiB), (1300 * MiB, 1344 * MiB), (1345 * MiB, 1408 * MiB)])
def test_tidy_rounds_up_to_a_sixteenth_of_the_power_of_two_below(size: int, tidied: int) -> None:
    assert tidy(size) == tidied


@given(st.integers(min_value=1, max_value=1 << 44))
def test_tidy_never_rounds_down_and_adds_at_most_a_sixteenth_from_16mi(size: int) -> None:
    assert tidy(size) >= size and (size < 16 * MiB or tidy(size) <= size * 17 / 16)


def test_learned_memory_waits_for_enough_runs_then_takes_p95_with_headroom_and_a_floor() -> None:
    assert learned_memory(MemoryProfile(4, 100 * MiB, 160 * MiB, 170 * MiB), 5, 1.3, 64 * MiB) is None
    assert learned_memory(MemoryProfile(5, 100 * MiB, 160 * MiB, 170 * MiB), 5, 1.3, 64 * MiB) == 208 * MiB
    assert learned_memory(MemoryProfile(9, 2 * MiB, 3 * MiB, 3 * MiB), 5, 1.3, 64 * MiB) == 64 * MiB


def test_auto_memory_is_an_axis_of_its_own() -> None:
    auto = Compute(memory="auto")
    assert auto.auto_memory and auto.memory == "auto" and auto.memory_bytes is None
    assert auto.inherit(Compute(cpu="2", memory="1Gi")) == Compute(cpu="2", memory="auto")   # set: it wins
    assert Compute(cpu="2").inherit(auto).auto_memory                                       # inherited
    assert auto != Compute() and pickle.loads(pickle.dumps(auto)) == auto
    assert Compute.from_dict(auto.to_dict()) == auto and auto.describe() == "memory=auto"
    assert not auto.replace(memory_bytes=MiB).auto_memory


def test_a_bad_memory_names_auto_among_the_accepted_forms() -> None:
    with pytest.raises(ConfigurationError, match="'lots'.*or \"auto\""):
        Compute(memory="lots")
