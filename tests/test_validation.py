"""Validation at every door: every public constructor and every setting, given any value, either
accepts it or raises a sluice error naming it; the values a fuzz of the previous main found are
each refused or accepted as documented."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sluice
from sluice import (
    Backoff,
    Compute,
    ComputeEscalation,
    ResourceClass,
    RetryPolicy,
    Settings,
)
from sluice.config import setting_keys
from sluice.errors import ConfigurationError, SluiceError
from sluice.tasks.remote.settings import RemoteSettings
from sluice.units import MAX_VALUE, parse_size

#: Anything a user might pass: numbers of every kind (nan, inf, huge), text with non-ASCII digits
#: and long digit runs, containers, bytes.
ANY = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**30), st.floats(),
    st.text(max_size=20), st.text(alphabet="0123456789.eEkKMGTmi+-١１²", max_size=12),
    st.from_regex(r"[0-9]{60,5000}", fullmatch=True), st.binary(max_size=8),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)

CONSTRUCTORS: dict[str, Callable[[Any], object]] = {
    "Compute(cpu=)": lambda v: Compute(cpu=v),
    "Compute(memory=)": lambda v: Compute(memory=v),
    "Compute(gpu=)": lambda v: Compute(gpu=v),
    "parse_size": parse_size,
    "Backoff(initial=)": lambda v: Backoff(initial=v),
    "Backoff(factor=)": lambda v: Backoff(factor=v, maximum=1e4),
    "Backoff(maximum=)": lambda v: Backoff(maximum=v),
    "ComputeEscalation(factor=)": lambda v: ComputeEscalation(factor=v),
    "ComputeEscalation(max_memory=)": lambda v: ComputeEscalation(max_memory=v),
    "RetryPolicy(max_retries=)": lambda v: RetryPolicy(max_retries=v),
    "ResourceClass(slots=)": lambda v: ResourceClass.from_mapping("x", {"cpu": "1", "memory": "1Gi", "slots": v}),
    "remote(memory=)": lambda v: sluice.remote(memory=v)(_noop),
    "remote(packages=)": lambda v: sluice.remote(packages=v)(_noop),
}


def _noop() -> None:
    """A function to decorate."""


def _accepted_or_sluice_error(build: Callable[[Any], object], value: Any) -> object | None:
    try:
        return build(value)
    except SluiceError:
        return None


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=ANY)
def test_constructors_accept_or_raise_a_sluice_error(name: str, value: Any) -> None:
    """No value makes a public constructor raise anything but a sluice error (no TypeError,
    ValueError, decimal.Overflow or OverflowError escapes)."""
    built = _accepted_or_sluice_error(CONSTRUCTORS[name], value)
    if isinstance(built, Compute):  # what is accepted is canonical and bounded
        for axis in (built.millicores, built.memory_bytes):
            assert axis is None or 0 < axis <= MAX_VALUE * 1000
    if isinstance(built, Backoff):
        assert all(math.isfinite(x) for x in (built.initial, built.factor, built.maximum))
        assert built.delay(10_000) <= built.maximum


def _toml(value: Any) -> str | None:
    """``value`` as a TOML literal, or None when TOML cannot write it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) < 2**63 else None
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return '"' + "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}"
                             for c in value) + '"' if all(ord(c) < 0x10000 for c in value) else None
    return None


SETTINGS = [k for k in setting_keys(Settings) + setting_keys(RemoteSettings) if k != "classes"]


@pytest.mark.parametrize("key", SETTINGS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=ANY)
def test_every_setting_from_env_or_file_accepts_or_raises_a_sluice_error(key: str, value: Any,
                                                                         tmp_path: Path) -> None:
    """Every setting, from the environment (text) or sluice.toml (a typed value), is loaded or
    refused with a ConfigurationError naming it."""
    for env, literal in (({f"SLUICE_{key.upper()}": str(value)}, None), ({}, _toml(value))):
        if not env and literal is None:
            continue
        (tmp_path / "sluice.toml").write_text(f"{key} = {literal}\n" if literal else "")
        try:
            Settings.load(cwd=tmp_path, env=env)
        except ConfigurationError as exc:
            assert key in str(exc) or key.upper() in str(exc)


@pytest.mark.parametrize(("build", "match"), [
    (lambda: Compute(memory="1e1000000"), "not a quantity"),
    (lambda: Compute(memory="9" * 5000), "not a quantity"),
    (lambda: Compute(gpu="²"), "not a count"),
    (lambda: Compute(cpu="١"), "not a quantity"),
    (lambda: Compute(memory="１Gi"), "not a quantity"),
    (lambda: Compute(cpu=float("nan")), "not a finite number"),
    (lambda: Backoff(initial="1"), "Backoff initial='1' must be a number"),
    (lambda: Backoff(initial=float("nan")), "finite"),
    (lambda: Backoff(maximum=float("inf")), "finite"),
    (lambda: Backoff(initial=True), "must be a number"),
    (lambda: ComputeEscalation(factor=float("inf")), "finite"),
    (lambda: ComputeEscalation(factor=float("nan")), "finite"),
    (lambda: ComputeEscalation(factor=1e308), "at most 1000"),
    (lambda: sluice.remote(memory=0)(_noop), "memory=0 must be a size greater than zero"),
    (lambda: sluice.remote(packages=123)(_noop), "must be a list of requirements"),
    (lambda: sluice.remote(packages={"numpy": 1})(_noop), "must be a list of requirements"),
    (lambda: sluice.remote(packages=["numpy==="])(_noop), "operator without a version"),
])
def test_values_found_by_the_fuzz_are_refused_by_name(build: Callable[[], object], match: str) -> None:
    """Each value the fuzz of the previous main found raising a non-sluice error, or silently
    accepted, now raises ConfigurationError with a message that says what is wrong."""
    with pytest.raises(ConfigurationError, match=match):
        build()


@pytest.mark.parametrize(("toml", "match"), [
    ("visibility_timeout = true", "visibility_timeout=True must be a positive whole number"),
    ("heartbeat_interval = inf", "heartbeat_interval=inf must be a positive number from 0.1 to 60"),
    ("heartbeat_interval = 0.01", "heartbeat_interval=0.01"),
    ("watchdog_interval = nan", "watchdog_interval=nan"),
    ("classes = \"x\"", "setting classes='x' must be a table"),
    ("[classes.gpu]\nenabled = \"no\"", "enabled='no' must be true or false"),
    ("[classes]\ngpu = 3", "resource class 'gpu' must be a table"),
])
def test_bad_settings_in_sluice_toml_are_refused_by_name(tmp_path: Path, toml: str, match: str) -> None:
    """Values the fuzz found accepted wrongly (a bool as 1 s, inf that never beats, a string
    "no" that kept a class enabled) or raising ValueError, now raise ConfigurationError."""
    (tmp_path / "sluice.toml").write_text(toml + "\n")
    with pytest.raises(ConfigurationError, match=match):
        Settings.load(cwd=tmp_path, env={})


def test_unknown_sluice_env_variable_is_refused_with_the_closest_name(tmp_path: Path) -> None:
    """A typo such as SLUICE_VISIBILTY_TIMEOUT is not ignored: the ConfigurationError names it and
    the setting it probably meant, and only it (the known variables beside it are not named)."""
    with pytest.raises(ConfigurationError) as caught:
        Settings.load(cwd=tmp_path, env={"SLUICE_VISIBILTY_TIMEOUT": "30", "SLUICE_GPU_COUNT": "1",
                                         "SLUICE_VISIBILITY_TIMEOUT": "40"})
    named = str(caught.value).split(";")[0]
    assert named == ("environment variables that are not sluice settings: "
                     "SLUICE_VISIBILTY_TIMEOUT (did you mean SLUICE_VISIBILITY_TIMEOUT?)")


def test_a_home_of_a_user_this_machine_lacks_is_a_configuration_error(tmp_path: Path) -> None:
    """`~0` (found by the fuzz above): pathlib raises RuntimeError; sluice names the setting."""
    with pytest.raises(ConfigurationError, match="setting home: '~0'"):
        Settings.load(cwd=tmp_path, env={"SLUICE_HOME": "~0"})


def test_a_remote_env_dir_of_a_user_this_machine_lacks_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="setting env_dir: '~0'"):
        Settings.load(cwd=tmp_path, env={"SLUICE_ENV_DIR": "~0"}, sections=[RemoteSettings])
