"""Quantities: every accepted form, every rejected form, and round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.errors import ConfigurationError
from sluice.units import (
    MAX_VALUE,
    format_cpu,
    format_memory,
    format_size,
    parse_cpu,
    parse_memory,
    parse_size,
)

Ki, Mi, Gi, Ti = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize(("text", "millicores"), [
    ("4", 4000), ("500m", 500), ("0.5", 500), ("1.5", 1500), (2, 2000), (0.25, 250), ("100m", 100),
    ("1", 1000), ("2.000", 2000), (" 3 ", 3000), ("+2", 2000),
])
def test_cpu_valid(text: object, millicores: int) -> None:
    assert parse_cpu(text) == millicores


@pytest.mark.parametrize("bad", ["", "abc", "-1", "0", "0m", "1.5m", "0.0001", "4 cores", "1Gi!", "1e3m", True, None, [1], "m"])
def test_cpu_invalid_names_value_and_forms(bad: object) -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_cpu(bad)
    assert repr(bad) in str(err.value)
    assert "millicores" in str(err.value)


@pytest.mark.parametrize(("parse", "text"), [
    (parse_cpu, "1.0000000000000000000000000001"), (parse_cpu, "0.5000000000000000000000000000000000000001"),
    (parse_memory, "1.00000000000000000000000000001Ki"), (parse_memory, "1.0000000000000000000000000000000001E"),
])
def test_finer_than_unit_is_refused_at_any_precision(parse: object, text: str) -> None:
    """A value a hair above a whole millicore or byte, past Decimal's default 28 digits, is refused
    (rounded in a 28-digit context it would pass as exactly 1000m or 1024 bytes)."""
    with pytest.raises(ConfigurationError, match="finer than 1m|not a whole number of bytes"):
        parse(text)  # type: ignore[operator]


@given(st.integers(1, 10**6), st.integers(20, 55))
def test_cpu_one_digit_past_a_millicore_is_refused_whatever_its_place(millicores: int, place: int) -> None:
    """A cpu quantity within 64 characters that has one nonzero digit beyond the millicores, however
    far out, is refused; the same text without that digit parses exactly."""
    whole = f"{millicores // 1000}.{millicores % 1000:03d}"
    text = whole + "0" * (place - 3) + "1"
    if len(text) > 64:
        text = text[:63] + "1"
    assert parse_cpu(whole) == millicores
    with pytest.raises(ConfigurationError, match="finer than 1m"):
        parse_cpu(text)


@pytest.mark.parametrize(("text", "size"), [
    ("32Gi", 32 * Gi), ("512Mi", 512 * Mi), ("1G", 10**9), ("128974848", 128974848), ("129e6", 129 * 10**6),
    ("123Mi", 123 * Mi), ("1Ti", Ti), ("64Ki", 64 * Ki), ("1k", 1000), ("2M", 2 * 10**6), ("1.5Gi", 3 * Gi // 2),
    (1024, 1024), ("1E", 10**18), ("1e3", 1000), ("0.5Ki", 512),
])
def test_memory_valid(text: object, size: int) -> None:
    assert parse_memory(text) == size


@pytest.mark.parametrize("bad", ["", "12Qi", "-1Gi", "0", "1.5", "0.3Ki", "Gi", "1 Gi B", True, False, None, 1.5])
def test_memory_invalid_names_value_and_forms(bad: object) -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_memory(bad)
    assert repr(bad) in str(err.value)
    assert "Ki/Mi/Gi/Ti" in str(err.value)


@pytest.mark.parametrize(("millicores", "text"), [(4000, "4"), (500, "500m"), (1500, "1500m"), (1, "1m")])
def test_cpu_format_is_canonical(millicores: int, text: str) -> None:
    assert format_cpu(millicores) == text


@pytest.mark.parametrize(("size", "text"), [(32 * Gi, "32Gi"), (512 * Mi, "512Mi"), (10**9, "1G"), (1000, "1k"),
                                            (128974848, "123Mi"), (1023, "1023"), (3 * Gi // 2, "1536Mi")])
def test_memory_format_is_canonical(size: int, text: str) -> None:
    assert format_memory(size) == text


@given(st.integers(min_value=1, max_value=10**9))
def test_cpu_round_trip(millicores: int) -> None:
    assert parse_cpu(format_cpu(millicores)) == millicores


@given(st.integers(min_value=1, max_value=2**62))
def test_memory_round_trip(size: int) -> None:
    assert parse_memory(format_memory(size)) == size


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(["", "m", "Ki", "Mi", "Gi", "k", "M", "G"]))
def test_memory_parse_format_parse_is_stable(number: int, suffix: str) -> None:
    text = f"{number}{suffix}"
    if suffix == "m" and number % 1000:
        with pytest.raises(ConfigurationError):
            parse_memory(text)
        return
    size = parse_memory(text)
    assert parse_memory(format_memory(size)) == size


# Byte sizes for budgets (seed 003's Units table): whole numbers only.
@pytest.mark.parametrize(("value", "size"), [
    (1073741824, Gi), (0, 0), ("512Mi", 512 * Mi), ("512MiB", 512 * Mi), ("2G", 2 * 10**9), ("2GB", 2 * 10**9),
    ("1Ki", Ki), ("1KiB", Ki), ("1K", 1000), ("1KB", 1000), ("3Ti", 3 * Ti), ("4T", 4 * 10**12), ("1024", 1024),
    ("8 Gi", 8 * Gi),
])
def test_size_valid(value: object, size: int) -> None:
    assert parse_size(value) == size


@pytest.mark.parametrize("bad", ["1.5Gi", -1, "-1Gi", True, False, "", "  ", "garbage", "1Xi", "1gi", 1.0, None, "Gi"])
def test_size_invalid(bad: object) -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_size(bad, "memory")
    assert repr(bad) in str(err.value)
    assert "powers of 1024" in str(err.value)


@given(st.integers(min_value=0, max_value=2**50), st.sampled_from([("Ki", Ki), ("Mi", Mi), ("Gi", Gi), ("K", 1000),
                                                                   ("MB", 10**6), ("", 1)]))
def test_size_suffix_arithmetic(number: int, suffix: tuple[str, int]) -> None:
    """A size is number x its suffix's factor up to 2**63 - 1 bytes; a larger one is refused by name."""
    if number * suffix[1] <= MAX_VALUE:
        assert parse_size(f"{number}{suffix[0]}") == number * suffix[1]
    else:
        with pytest.raises(ConfigurationError, match="too large"):
            parse_size(f"{number}{suffix[0]}")


def test_format_size_reads_well() -> None:
    assert format_size(200 * Mi) == "200Mi"
    assert format_size(214732800) == "204.8Mi"
    assert format_size(12) == "12B"
