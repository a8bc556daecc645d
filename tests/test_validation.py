"""Validation at every door: every public constructor and every setting, given any value, either
accepts it or raises a sluice error naming it; the values a fuzz of the previous main found are
each refused or accepted as documented."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import sluice
from sluice import (
    Backoff,
    Compute,
    ComputeEscalation,
    ResourceClass,
    RetryPolicy,
    Settings,
)
from sluice.compute import MAX_GPUS
from sluice.config import setting_keys
from sluice.config.declare import specs
from sluice.config.values import DefaultCompute, Flag, Memory, Names, Number, PathValue, Size, Text
from sluice.errors import ConfigurationError, SluiceError
from sluice.tasks.remote.settings import RemoteSettings
from sluice.tasks.retry import MAX_DELAY, MAX_FACTOR
from sluice.units import MAX_VALUE, format_memory, parse_size

#: Anything a user might pass: numbers of every kind (nan, inf, huge), text with non-ASCII digits
#: and long digit runs, containers, bytes.
ANY = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**30), st.floats(),
    st.text(max_size=20), st.text(alphabet="0123456789.eEkKMGTmi+-١１²", max_size=12),
    st.from_regex(r"[0-9]{60,5000}", fullmatch=True), st.binary(max_size=8),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.lists(st.sampled_from(["requests", " Requests ", "numpy==1.26.0", "scikit_learn", "scikit-learn>=1", "attrs",
                              "zlib-ng", "Attrs[tests]"]), max_size=4),
)
#: Edges every constructor and setting meets each run (the fuzz may not draw them): zero, one, a
#: bool, sizes with each kind of suffix, a value past 2**63, an unsorted package list, flag words,
#: class names with spaces, a path under ~, a number past a bound.
EDGES = [0, 1, -1, 1.0, 0.5, 61, 1025, True, False, "0", "1", "1K", "1Ki", " 2Mi ", "3GB", "auto", 2**33, 2**63,
         ["zlib-ng", " attrs "], ["requests", "Requests==2"], "yes", " Off ", "maybe", " cpu, gpu ", "~/x", "a b",
         "1e400", "2.5", 86_400 * 3650 + 1]


def _with_edges(test: Callable[..., None]) -> Callable[..., None]:
    """``test`` run on each of EDGES too, as hypothesis examples."""
    for edge in EDGES:
        test = example(value=edge)(test)
    return test

def _noop() -> None:
    """A function to decorate."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _compute_cpu(value: Any, built: Compute) -> None:
    if value is None:                                         # the axis is left to inherit
        assert built._key() == (None, None, None, False)
        return
    assert built.memory_bytes is None and built.gpu is None and not built.auto_memory
    assert built.millicores is not None and 0 < built.millicores <= MAX_VALUE * 1000
    assert Compute(cpu=built.cpu) == built                     # canonical: its own text reads back the same
    if _is_int(value) or isinstance(value, float):
        assert built.millicores == Fraction(repr(value)) * 1000


def _compute_memory(value: Any, built: Compute) -> None:
    if value is None:                                         # the axis is left to inherit
        assert built._key() == (None, None, None, False)
        return
    assert built.millicores is None and built.gpu is None
    if built.auto_memory:
        assert value.strip() == "auto" and built.memory_bytes is None and built.memory == "auto"
        return
    assert built.memory_bytes is not None and 0 < built.memory_bytes <= MAX_VALUE
    assert Compute(memory=built.memory) == built
    if _is_int(value):
        assert built.memory_bytes == value


def _compute_gpu(value: Any, built: Compute) -> None:
    if value is None:                                         # the axis is left to inherit
        assert built._key() == (None, None, None, False)
        return
    assert built.millicores is None and built.memory_bytes is None
    assert _is_int(built.gpu) and 0 <= built.gpu <= MAX_GPUS
    assert built.gpu == (value if _is_int(value) else int(value.strip()))


#: The byte-size suffixes, as the README's Units table gives them.
SIZE_FACTORS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def _size_of(value: Any) -> int:
    """What a size the parser accepted must be: the int itself, or its digits times its suffix."""
    if _is_int(value):
        return value
    text = value.strip()
    digits = text[:len(text) - len(text.lstrip("0123456789"))]
    return int(digits) * SIZE_FACTORS[text[len(digits):].strip().removesuffix("B")]


def _parse_size(value: Any, built: int) -> None:
    assert _is_int(built) and 0 <= built <= MAX_VALUE
    assert built == _size_of(value)
    assert parse_size(str(built)) == built


def _backoff(field: str) -> Callable[[Any, Backoff], None]:
    def check(value: Any, built: Backoff) -> None:
        assert not isinstance(value, bool) and getattr(built, field) == value
        assert all(math.isfinite(x) for x in (built.initial, built.factor, built.maximum))
        assert 0 <= built.initial <= built.maximum <= MAX_DELAY and 1 <= built.factor <= MAX_FACTOR
        delays = [built.delay(n) for n in (1, 2, 3, 50, 10_000)]
        assert delays[0] == built.initial and delays == sorted(delays) and delays[-1] <= built.maximum
    return check


def _escalation_factor(value: Any, built: ComputeEscalation) -> None:
    assert not isinstance(value, bool) and built.factor == value and 1 < built.factor <= MAX_FACTOR
    assert built.next_memory(1 << 30) == min(int((1 << 30) * value), 64 << 30) >= 1 << 30


def _escalation_max_memory(value: Any, built: ComputeEscalation) -> None:
    assert 0 < built.max_memory_bytes <= MAX_VALUE
    assert ComputeEscalation(max_memory=format_memory(built.max_memory_bytes)).max_memory_bytes == \
        built.max_memory_bytes                                         # its canonical text reads back the same
    if _is_int(value):
        assert built.max_memory_bytes == value
    assert built.next_memory(MAX_VALUE) == built.max_memory_bytes        # the ceiling holds


def _retry_policy(value: Any, built: RetryPolicy) -> None:
    assert _is_int(value) and value >= 0 and built.max_retries == value and built.max_attempts == value + 1
    assert RetryPolicy.from_dict(built.to_dict()) == built


def _resource_class(value: Any, built: ResourceClass) -> None:
    assert _is_int(value) and value >= 1 and built.slots == value
    assert built.worker_size == Compute.of(1000 * value, value << 30, 0)  # larger ones are refused


def _remote_memory(value: Any, built: Any) -> None:
    memory = built.budget.memory
    if value is None:
        assert memory is None and built.budget.start(1 << 30) == 1 << 30     # the operator's default
        return
    assert _is_int(memory) and 0 < memory <= MAX_VALUE and memory == _size_of(value)
    assert built.budget.start(1 << 30) == memory


def _remote_packages(value: Any, built: Any) -> None:
    packages = built.packages
    assert isinstance(packages, tuple) and all(isinstance(p, str) and p == p.strip() and p for p in packages)
    names = [canonicalize_name(Requirement(p).name) for p in packages]
    assert names == sorted(set(names))                                 # sorted, one entry per package
    assert set(names) == {canonicalize_name(Requirement(e.strip()).name) for e in value or ()}
    assert set(packages) <= {e.strip() for e in value or ()}           # entries as given, never rewritten


#: Each public constructor, and what must hold of anything it accepts (canonical, bounded, read
#: back the same): ``check(value, built)``.
CONSTRUCTORS: dict[str, tuple[Callable[[Any], Any], Callable[[Any, Any], None]]] = {
    "Compute(cpu=)": (lambda v: Compute(cpu=v), _compute_cpu),
    "Compute(memory=)": (lambda v: Compute(memory=v), _compute_memory),
    "Compute(gpu=)": (lambda v: Compute(gpu=v), _compute_gpu),
    "parse_size": (parse_size, _parse_size),
    "Backoff(initial=)": (lambda v: Backoff(initial=v), _backoff("initial")),
    "Backoff(factor=)": (lambda v: Backoff(factor=v, maximum=1e4), _backoff("factor")),
    "Backoff(maximum=)": (lambda v: Backoff(maximum=v), _backoff("maximum")),
    "ComputeEscalation(factor=)": (lambda v: ComputeEscalation(factor=v), _escalation_factor),
    "ComputeEscalation(max_memory=)": (lambda v: ComputeEscalation(max_memory=v), _escalation_max_memory),
    "RetryPolicy(max_retries=)": (lambda v: RetryPolicy(max_retries=v), _retry_policy),
    "ResourceClass(slots=)": (lambda v: ResourceClass.from_mapping("x", {"cpu": "1", "memory": "1Gi", "slots": v}),
                              _resource_class),
    "remote(memory=)": (lambda v: sluice.remote(memory=v)(_noop), _remote_memory),
    "remote(packages=)": (lambda v: sluice.remote(packages=v)(_noop), _remote_packages),
}


def _accepted_or_sluice_error(build: Callable[[Any], object], value: Any) -> object | None:
    try:
        return build(value)
    except SluiceError:
        return None


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=ANY)
@_with_edges
def test_constructors_accept_or_raise_a_sluice_error_and_what_they_accept_is_canonical_and_bounded(
        name: str, value: Any) -> None:
    """No value makes a public constructor raise anything but a sluice error (no TypeError,
    ValueError, decimal.Overflow or OverflowError escapes), and a value it accepts holds that
    constructor's property: within its declared bounds, canonical (its own text reads back the
    same) and equal to the value given where the value is already canonical."""
    build, check = CONSTRUCTORS[name]
    built = _accepted_or_sluice_error(build, value)
    if built is not None:
        check(value, built)


def test_slots_whose_worker_size_overflows_are_refused_where_the_class_is_declared() -> None:
    """Found by the fuzz above: slots=2**33 of a 1Gi slot (a worker of 8Ei, which no compute can
    describe) was accepted, and worker_size raised later; the class is refused, naming slots."""
    with pytest.raises(ConfigurationError, match=r"resource class 'x': slots=8589934592 of .* use fewer slots"):
        ResourceClass.from_mapping("x", {"cpu": "1", "memory": "1Gi", "slots": 2**33})


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
#: Where each setting's key is read into: key -> (the class declaring it, its field, its declaration).
DECLARED = {key: (cls, name, spec) for cls in (Settings, RemoteSettings) for name, spec in specs(cls).items()
            for key in spec.keys}
TRUE, FALSE = {"1", "true", "yes", "on"}, {"", "0", "false", "no", "off"}


def _default(cls: type, name: str) -> Any:
    declared = next(f for f in dataclasses.fields(cls) if f.name == name)
    return declared.default_factory() if declared.default is dataclasses.MISSING else declared.default


def _check_loaded(key: str, raw: Any, loaded: Settings, from_env: bool) -> None:
    """What a setting's kind must have made of ``raw`` (the environment's text or the file's typed
    value), judged from the declared kind alone: the accepted forms, the bounds, the default for
    an empty value. Raises AssertionError naming what was accepted wrongly."""
    cls, name, spec = DECLARED[key]
    value = getattr(loaded if cls is Settings else loaded.section(cls), name)
    kind, empty = spec.kind, raw is None or raw == ""
    what = f"{key}={raw!r} ({'environment' if from_env else 'sluice.toml'}) was loaded as {value!r}"
    if from_env and raw == "":                                      # an empty variable is unset
        assert value == _default(cls, name), what
        return
    if isinstance(kind, Text):
        assert value == (_default(cls, name) if empty else raw), what
        if key == "intake_queue":
            assert value.replace("-", "").replace("_", "").replace(".", "").isalnum(), what
            assert value not in loaded.catalog, what
    elif isinstance(kind, PathValue):
        assert value == (_default(cls, name) if empty else Path(raw).expanduser()), what
    elif isinstance(kind, Number):
        number = float(raw.strip()) if isinstance(raw, str) else raw
        assert not isinstance(number, bool) and isinstance(number, (int, float)) and value == number, what
        assert math.isfinite(value) and kind.low <= value <= kind.high, what
        assert not (kind.low_open and value == kind.low), what
        assert isinstance(value, int) if kind.whole else isinstance(value, float), what
    elif isinstance(kind, Flag):
        text = str(raw).strip().lower()
        assert isinstance(value, bool) and (isinstance(raw, bool) or text in TRUE | FALSE), what
        assert value == (raw if isinstance(raw, bool) else text in TRUE), what
    elif isinstance(kind, Names):
        names = raw.split(",") if isinstance(raw, str) else raw
        assert value == (_default(cls, name) if empty else tuple(n.strip() for n in names)), what
        assert all(n and n in loaded.catalog for n in value or ()), what
    elif isinstance(kind, (Size, Memory)):
        assert _is_int(value) and (0 if isinstance(kind, Size) else 1) <= value <= MAX_VALUE, what
        if _is_int(raw) or isinstance(kind, Size):
            assert value == _size_of(raw), what
        else:
            assert Compute(memory=raw).memory_bytes == value == Compute(memory=format_memory(value)).memory_bytes, what
    elif isinstance(kind, DefaultCompute):
        axis = key.rsplit("_", 1)[-1]
        given = Compute(**{axis: raw})
        assert value.inherit(kind.builtin) == given.inherit(kind.builtin) == value, what  # the other axis: built-in
        assert (value.millicores or 0) > 0 and ((value.memory_bytes or 0) > 0 or value.auto_memory), what
    else:
        raise AssertionError(f"{key}: no check for its kind {kind!r}; add one")


@pytest.mark.parametrize("key", SETTINGS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=ANY)
@_with_edges
def test_every_setting_from_env_or_file_is_loaded_as_its_kind_reads_it_or_refused_by_name(
        key: str, value: Any, tmp_path: Path) -> None:
    """Every setting, from the environment (text) or sluice.toml (a typed value), is either
    refused with a ConfigurationError naming it, or loaded as its declared kind reads it: within
    the kind's bounds, in one of its accepted forms, equal to the value given (the default when
    given empty)."""
    for env, literal in (({f"SLUICE_{key.upper()}": str(value)}, None), ({}, _toml(value))):
        if not env and literal is None:
            continue
        (tmp_path / "sluice.toml").write_text(f"{key} = {literal}\n" if literal else "")
        try:
            loaded = Settings.load(cwd=tmp_path, env=env)
        except ConfigurationError as exc:
            assert key in str(exc) or key.upper() in str(exc)
            continue
        raw = str(value) if env else tomllib.loads(f"v = {literal}")["v"]
        _check_loaded(key, raw, loaded, from_env=bool(env))


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
