"""Quantities: Kubernetes cpu and memory quantities, and byte sizes for budgets.

Two grammars live here because users meet both:

* Kubernetes quantities (``"500m"``, ``"1.5"``, ``"32Gi"``, ``"129e6"``) size compute, exactly as
  a pod spec would. They are parsed once to canonical ints (millicores, bytes) and formatted back
  to the shortest canonical string.
* Byte sizes (``"512Mi"``, ``"2G"``, ``1073741824``) size budgets such as a remote function's
  memory. They are whole numbers only: ``"1.5Gi"`` is rejected.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from sluice.errors import ConfigurationError

_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
#: The suffixes format_memory tries, binary before decimal, each table largest first (it runs for
#: every result a worker stores, so the order is worked out once).
_LARGEST_FIRST = [kv for table in (_BINARY, _DECIMAL) for kv in sorted(table.items(), key=lambda kv: -kv[1])]
# ASCII digits only (\d would take "١" and "１"); an exponent of at most two digits.
_QUANTITY = re.compile(
    r"^(?P<num>[+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|"
    r"[eE][+-]?[0-9]{1,2})?$"
)
#: Longer text is refused before it is parsed: no real quantity needs more.
MAX_TEXT = 64
#: The largest quantity in base units (bytes, cores) and the largest byte size: 2**63 - 1.
MAX_VALUE = (1 << 63) - 1

CPU_FORMS = 'a number of cores ("4", "0.5", "1.5", 2) or millicores ("500m")'
MEMORY_FORMS = (
    'bytes (128974848, "129e6") or a Kubernetes suffix: Ki/Mi/Gi/Ti (powers of 1024, "512Mi") '
    'or k/M/G/T (powers of 1000, "1G")'
)
SIZE_FORMS = (
    "a whole number of bytes (1073741824) or a whole number with a suffix: "
    'Ki/Mi/Gi/Ti or KiB/MiB/GiB/TiB (powers of 1024, "512Mi"), '
    'K/M/G/T or KB/MB/GB/TB (powers of 1000, "2G")'
)


def _quantity(value: object, what: str, forms: str) -> Fraction:
    """Parse a Kubernetes quantity to an exact number in base units (cores or bytes).

    A Fraction, not a Decimal: Decimal arithmetic rounds to its context's 28 digits, which would
    let ``"1.0000000000000000000000000001"`` pass as 1 core; a Fraction is exact at any length."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigurationError(f"{what} {value!r} is not a quantity; use {forms}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigurationError(f"{what} {value!r} is not a finite number; use {forms}")
    text = str(value).strip() if not isinstance(value, float) else repr(value)
    match = _QUANTITY.match(text) if len(text) <= MAX_TEXT else None
    if not match:
        raise ConfigurationError(f"{what} {value!r} is not a quantity; use {forms}")
    number = Fraction(match["num"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        number *= _BINARY[suffix]
    elif suffix in _DECIMAL:
        number *= _DECIMAL[suffix]
    elif suffix == "m":
        number /= 1000
    elif suffix:
        number *= Fraction(10) ** int(suffix[1:])
    if number > MAX_VALUE:
        raise ConfigurationError(f"{what} {value!r} is too large (at most {MAX_VALUE}); use {forms}")
    return number


def parse_cpu(value: object) -> int:
    """Kubernetes cpu quantity -> millicores. ``"500m"`` -> 500, ``"1.5"`` -> 1500."""
    cores = _quantity(value, "cpu", CPU_FORMS)
    millis = cores * 1000
    if millis.denominator != 1:
        raise ConfigurationError(f"cpu {value!r} is finer than 1m; use {CPU_FORMS}")
    if millis <= 0:
        raise ConfigurationError(f"cpu {value!r} must be greater than zero; use {CPU_FORMS}")
    return int(millis)


def parse_memory(value: object) -> int:
    """Kubernetes memory quantity -> bytes. ``"32Gi"`` -> 34359738368, ``"1G"`` -> 10**9."""
    size = _quantity(value, "memory", MEMORY_FORMS)
    if size.denominator != 1:
        raise ConfigurationError(f"memory {value!r} is not a whole number of bytes; use {MEMORY_FORMS}")
    if size <= 0:
        raise ConfigurationError(f"memory {value!r} must be greater than zero; use {MEMORY_FORMS}")
    return int(size)


def format_cpu(millicores: int) -> str:
    """Millicores -> canonical cpu string: whole cores as ``"4"``, otherwise ``"1500m"``."""
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def format_memory(size: int) -> str:
    """Bytes -> canonical memory string: the largest binary, else decimal, suffix that divides exactly."""
    for suffix, factor in _LARGEST_FIRST:
        if size % factor == 0:
            return f"{size // factor}{suffix}"
    return str(size)


_SIZE = re.compile(r"^(?P<num>[0-9]{1,20})\s*(?P<suffix>[KMGT]i?B?)?$")
_SIZE_FACTORS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12} | {
    k: v for k, v in _BINARY.items() if k in ("Ki", "Mi", "Gi", "Ti")
}


def parse_size(value: object, what: str = "size") -> int:
    """Byte size for budgets: int bytes, or a whole number with Ki/Mi/Gi/Ti or K/M/G/T (B optional)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigurationError(f"{what} {value!r} is not a size; use {SIZE_FORMS}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(value.strip()) if len(value) <= MAX_TEXT else None
        if not match:
            raise ConfigurationError(f"{what} {value!r} is not a size; use {SIZE_FORMS}")
        size = int(match["num"]) * _SIZE_FACTORS[(match["suffix"] or "").removesuffix("B")]
    if size < 0:
        raise ConfigurationError(f"{what} {value!r} is negative; use {SIZE_FORMS}")
    if size > MAX_VALUE:
        raise ConfigurationError(f"{what} {value!r} is too large (at most {MAX_VALUE} bytes); use {SIZE_FORMS}")
    return size


def real_number(value: object, what: str, low: float, high: float, *, low_open: bool = False) -> float:
    """A finite int or float (never a bool, a string or nan/inf) within ``[low, high]`` (``(low,
    high]`` with ``low_open``); anything else is a ConfigurationError naming it and the range."""
    bound = f"{'greater than' if low_open else 'at least'} {low:g} and at most {high:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{what}={value!r} must be a number {bound}")
    number = float(value)
    if not math.isfinite(number) or number > high or number < low or (low_open and number == low):
        raise ConfigurationError(f"{what}={value!r} must be a finite number {bound}")
    return number


def format_size(size: int) -> str:
    """Bytes -> a human string for logs and messages (binary units, one decimal)."""
    for suffix, factor in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
        if size >= factor:
            value = size / factor
            return f"{value:.0f}{suffix}" if value == int(value) else f"{value:.1f}{suffix}"
    return f"{size}B"
