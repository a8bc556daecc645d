"""Settings: precedence (env over sluice.toml over [tool.sluice] in pyproject over defaults),
each setting refused by name, the declarations as the one list of settings, and up.json."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from sluice import Compute, Settings
from sluice.config import Section, UpState, embedded_broker_url, setting, setting_keys
from sluice.config.up import embedded_state
from sluice.config.values import Flag
from sluice.errors import ConfigurationError
from sluice.tasks.remote.settings import RemoteSettings

ROOT = Path(__file__).resolve().parent.parent


def test_defaults(tmp_path: Path) -> None:
    settings = Settings.load(cwd=tmp_path, env={})
    assert settings.default_compute == Compute(cpu="1", memory="512Mi")
    assert settings.catalog.names == ["cpu", "highmem", "gpu"]
    assert settings.broker_url is None


def test_precedence(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.sluice]\ndefault_memory = "1Gi"\nvisibility_timeout = 100\n'
        '[tool.sluice.classes.highmem]\nmemory = "128Gi"\nslots = 2\n'
    )
    (tmp_path / "sluice.toml").write_text("visibility_timeout = 200\n[classes.highmem]\nslots = 3\n")
    env = {"SLUICE_VISIBILITY_TIMEOUT": "300", "SLUICE_CLASSES": json.dumps({"tiny": {"cpu": "1", "memory": "1Gi"}})}
    settings = Settings.load(cwd=tmp_path, env=env)
    assert settings.visibility_timeout == 300
    assert settings.default_compute.memory == "1Gi"
    highmem = settings.catalog.get("highmem")
    assert (highmem.slot.memory, highmem.slots) == ("128Gi", 3)
    assert "tiny" in settings.catalog


def test_sluice_config_env_points_at_a_file(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.toml"
    path.write_text('broker_url = "redis://example:6379/1"\n')
    assert Settings.load(cwd=tmp_path, env={"SLUICE_CONFIG": str(path)}).broker_url == "redis://example:6379/1"
    with pytest.raises(ConfigurationError, match="not a file"):
        Settings.load(cwd=tmp_path, env={"SLUICE_CONFIG": str(tmp_path / "missing.toml")})


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"SLUICE_CLASSES": "{nope"}, "not JSON"),
        ({"SLUICE_CLASSES": "[1]"}, "JSON object"),
        ({"SLUICE_VISIBILITY_TIMEOUT": "-5"}, "positive"),
        ({"SLUICE_DEFAULT_MEMORY": "lots"}, "'lots'"),
    ],
)
def test_bad_env(tmp_path: Path, env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Settings.load(cwd=tmp_path, env=env)


def test_unknown_setting_is_named(tmp_path: Path) -> None:
    (tmp_path / "sluice.toml").write_text("brokr_url = 'x'\n")
    with pytest.raises(ConfigurationError, match="brokr_url"):
        Settings.load(cwd=tmp_path, env={})


def test_invalid_toml(tmp_path: Path) -> None:
    (tmp_path / "sluice.toml").write_text("= nope")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        Settings.load(cwd=tmp_path, env={})


def test_a_config_file_that_is_not_utf8_or_whose_tool_sluice_is_not_a_table_is_refused(tmp_path: Path) -> None:
    """A sluice.toml with a byte that is not UTF-8, or a pyproject.toml whose [tool] sluice is not a
    table, is a ConfigurationError naming the file, not a UnicodeDecodeError or TypeError."""
    (tmp_path / "sluice.toml").write_bytes(b'broker_url = "redis://\xff"\n')
    with pytest.raises(ConfigurationError, match="sluice.toml is not valid TOML"):
        Settings.load(cwd=tmp_path, env={})
    (tmp_path / "sluice.toml").unlink()
    (tmp_path / "pyproject.toml").write_text("[tool]\nsluice = 1\n")
    with pytest.raises(ConfigurationError, match=r"\[tool.sluice\] must be a table"):
        Settings.load(cwd=tmp_path, env={})


@pytest.mark.parametrize("url", ["redis://host:abc/0", "sentinel://host:abc", "sentinel://host:1/x"])
def test_a_broker_url_with_a_bad_port_or_db_is_a_configuration_error_naming_it(url: str) -> None:
    """A port or database that is not a number is refused naming the URL (redis-py raises ValueError)."""
    from sluice import redis_client

    with pytest.raises(ConfigurationError, match="is not a Redis URL") as err:
        redis_client.connect(url, settings=Settings.load(cwd=Path("/nonexistent"), env={}))
    assert repr(url) in str(err.value)


@pytest.mark.parametrize("toml", ["brokr_url = 'x'", "remote_memroy = '2Gi'"])
def test_an_unknown_setting_in_a_file_is_refused_naming_it_and_the_accepted_ones(tmp_path: Path, toml: str) -> None:
    """A typo of a core setting or of a capability's (remote functions') is an error, not ignored."""
    (tmp_path / "sluice.toml").write_text(toml + "\n")
    typo = toml.split(" ")[0]
    with pytest.raises(
        ConfigurationError,
        match=rf"unknown sluice settings \['{typo}'\]; accepted: .*broker_url.*"
        r"remote_memory",
    ):
        Settings.load(cwd=tmp_path, env={})


def test_an_unknown_sluice_env_variable_is_refused_naming_the_capability_setting_it_resembles(
    tmp_path: Path,
) -> None:
    """A SLUICE_* variable that is no setting is a ConfigurationError, as an unknown file key is;
    a capability's settings are among the names offered."""
    with pytest.raises(ConfigurationError, match=r"SLUICE_REMOTE_MEMROY \(did you mean SLUICE_REMOTE_MEMORY\?\)"):
        Settings.load(cwd=tmp_path, env={"SLUICE_REMOTE_MEMROY": "2Gi"})


def test_variables_that_are_not_settings_but_known_are_accepted(tmp_path: Path) -> None:
    """The compose passwords, the GPU overrides, Kubernetes service links of sluice's Services and
    the variables of a capability this app does not load start an app; the same environment with
    one typo added does not (the control: the check is live for this very environment)."""
    env = {
        "SLUICE_REDIS_PASSWORD": "pw", "SLUICE_FLOWER_AUTH": "a:b", "SLUICE_GPU_COUNT": "0",
        "SLUICE_REDIS_SERVICE_HOST": "10.0.0.1", "SLUICE_REDIS_PORT": "tcp://10.0.0.1:6379",
        "SLUICE_REDIS_PORT_6379_TCP_ADDR": "10.0.0.1", "SLUICE_FLOWER_SERVICE_PORT_HTTP": "5555",
        "SLUICE_REMOTE_MEMORY": "2Gi",
    }
    settings = Settings.load(cwd=tmp_path, env=env, sections=[])
    assert settings.sections == {}
    with pytest.raises(ConfigurationError, match="SLUICE_VISIBILTY_TIMEOUT"):
        Settings.load(cwd=tmp_path, env=env | {"SLUICE_VISIBILTY_TIMEOUT": "30"}, sections=[])


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        # the core: out of bounds
        ("heartbeat_interval", 100, "setting heartbeat_interval=100 must be a positive number from 0.1 to 60"),
        ("visibility_timeout", 0, "setting visibility_timeout=0 must be a positive whole number from 1 to 315360000"),
        ("auto_min_runs", 2.5, "setting auto_min_runs=2.5 must be a positive whole number from 1 to 1000000"),
        # the core: wrong type
        ("visibility_timeout", "soon", "setting visibility_timeout='soon' must be a positive whole number"),
        ("orphan_grace", True, "setting orphan_grace=True must be a positive number from 0.1 to 86400"),
        ("broker_url", 5, "setting broker_url=5 must be text (a string)"),
        ("auto_floor", "lots", "setting auto_floor: memory 'lots' is not a quantity"),
        ("default_memory", [1], "setting default_cpu/default_memory: memory [1] is not a quantity"),
        # remote functions' section: out of bounds
        (
            "remote_growth_factor",
            1000,
            "setting remote_growth_factor=1000 must be a positive number above 1 and at most 100",
        ),
        ("remote_memory_share", 0, "setting remote_memory_share=0 must be a positive number above 0 and at most 1"),
        ("env_cache_size", -1, "setting env_cache_size -1 is negative"),
        # remote functions' section: wrong type
        ("stream_logs", "maybe", "setting stream_logs='maybe' must be true or false"),
        ("remote_memory", "lots", "setting remote_memory 'lots' is not a size; use"),
        ("remote_classes", 3, "setting remote_classes=3 must be a list of class names"),
    ],
)
def test_a_bad_value_in_a_file_is_refused_naming_the_setting_the_value_and_what_is_accepted(
    tmp_path: Path, key: str, value: object, message: str
) -> None:
    (tmp_path / "sluice.toml").write_text(f"{key} = {json.dumps(value)}\n")
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        Settings.load(cwd=tmp_path, env={})


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "SLUICE_HEARTBEAT_INTERVAL",
            "0.01",
            "setting heartbeat_interval='0.01' must be a positive number from 0.1 to 60",
        ),
        ("SLUICE_VISIBILITY_TIMEOUT", "1.5", "setting visibility_timeout='1.5' must be a positive whole number"),
        (
            "SLUICE_REAPER_INTERVAL",
            "often",
            "setting reaper_interval='often' must be a positive number from 0.1 to 3600",
        ),
        (
            "SLUICE_REMOTE_GROWTH_THRESHOLD",
            "2",
            "setting remote_growth_threshold='2' must be a positive number above 0 and at most 1",
        ),
        ("SLUICE_FRESH_ENV_PER_CALL", "sometimes", "setting fresh_env_per_call='sometimes' must be true or false"),
        ("SLUICE_ENV_CACHE_SIZE", "big", "setting env_cache_size 'big' is not a size"),
    ],
)
def test_a_bad_value_in_the_environment_is_refused_naming_the_setting_the_value_and_what_is_accepted(
    tmp_path: Path, name: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        Settings.load(cwd=tmp_path, env={name: value})


def test_a_section_is_read_from_every_layer_with_its_declared_defaults(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.sluice]\nremote_memory = "4Gi"\nenv_cache_size = "1Gi"\n')
    (tmp_path / "sluice.toml").write_text('remote_memory = "3Gi"\nhome = "/srv/sluice"\n')
    remote = Settings.load(cwd=tmp_path, env={"SLUICE_STREAM_LOGS": "yes"}).section(RemoteSettings)
    assert (remote.remote_memory, remote.env_cache_size, remote.stream_logs) == (3 << 30, 1 << 30, True)
    assert remote.envs_path == Path("/srv/sluice/envs")  # home: the core setting of the same name
    assert (remote.remote_growth_factor, remote.remote_classes, remote.fresh_env_per_call) == (2.0, None, False)


def test_a_section_that_declares_a_setting_again_is_refused(tmp_path: Path) -> None:
    """The core and every section share one flat namespace of keys: a key declared twice is an error."""

    @dataclass(frozen=True)
    class Clash(Section):
        stream_logs: bool = setting(Flag(), "the remote section's, declared again", default=False)

    with pytest.raises(ConfigurationError, match="setting stream_logs is declared twice"):
        Settings.load(cwd=tmp_path, env={}, sections=[RemoteSettings, Clash])


def test_the_readme_configuration_table_lists_every_declared_setting() -> None:
    """The README's table is the users' list of settings: it names every declared one and no other."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| setting | env |") : text.index("```toml", text.index("| setting | env |"))]
    documented = {
        name
        for row in table.splitlines()[2:]
        if row.startswith("|")
        for name in re.findall(r"`(\w+)`", row.split("|")[1])
    }
    assert documented == {*setting_keys(Settings), *setting_keys(RemoteSettings)}


def test_up_json_is_one_record_read_back_as_written(tmp_path: Path) -> None:
    """``sluice up`` writes an UpState; the core reads the same record back (pid alive), 0600."""
    state = UpState(
        pid=os.getpid(),
        broker_url="redis://127.0.0.1:7000/0",
        flower_url=None,
        app="tests.apps.basic",
        children={"cpu": 12},
        remote_secret="s3cret",
    )
    state.write(tmp_path)
    assert UpState.decode((tmp_path / "up.json").read_text()) == state
    assert (tmp_path / "up.json").stat().st_mode & 0o777 == 0o600
    assert embedded_state(tmp_path) == state and embedded_broker_url(tmp_path) == "redis://127.0.0.1:7000/0"
    assert Settings(home=tmp_path).signing_secret() == "s3cret"
    assert Settings(home=tmp_path, remote_secret="mine").signing_secret() == "mine"


@pytest.mark.parametrize(
    "text", ["{nope", "[]", '{"pid": "1"}', '{"pid": 1, "children": [1]}', '{"pid": 1, "broker_url": 5}']
)
def test_an_up_json_that_is_not_the_record_reads_as_no_running_up(tmp_path: Path, text: str) -> None:
    with pytest.raises(ValueError):
        UpState.decode(text)
    (tmp_path / "up.json").write_text(text)
    assert embedded_state(tmp_path) is None and embedded_broker_url(tmp_path) is None


def test_an_up_json_whose_process_is_gone_reads_as_no_running_up(tmp_path: Path) -> None:
    UpState(pid=2**22 + 12345, broker_url="redis://127.0.0.1:7000/0").write(tmp_path)
    assert embedded_state(tmp_path) is None
