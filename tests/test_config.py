"""Settings precedence: env over sluice.toml over [tool.sluice] in pyproject over defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice import Compute, Settings
from sluice.errors import ConfigurationError


def test_defaults(tmp_path: Path) -> None:
    settings = Settings.load(cwd=tmp_path, env={})
    assert settings.default_compute == Compute(cpu="1", memory="512Mi")
    assert settings.catalog.names == ["cpu", "highmem", "gpu"]
    assert settings.broker_url is None


def test_precedence(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.sluice]\ndefault_memory = "1Gi"\nvisibility_timeout = 100\n'
        '[tool.sluice.classes.highmem]\nmemory = "128Gi"\nslots = 2\n')
    (tmp_path / "sluice.toml").write_text('visibility_timeout = 200\n[classes.highmem]\nslots = 3\n')
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


@pytest.mark.parametrize(("env", "match"), [
    ({"SLUICE_CLASSES": "{nope"}, "not JSON"),
    ({"SLUICE_CLASSES": "[1]"}, "JSON object"),
    ({"SLUICE_VISIBILITY_TIMEOUT": "-5"}, "positive"),
    ({"SLUICE_DEFAULT_MEMORY": "lots"}, "'lots'"),
])
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
