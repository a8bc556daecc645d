"""Settings: one frozen object read from env ``SLUICE_*`` over ``sluice.toml`` over pyproject.

The package's parts, one job each:

* :mod:`~sluice.config.settings`: the core's settings, declared once each, and loading them;
* :mod:`~sluice.config.declare`: how a setting is declared, and what is derived from that;
* :mod:`~sluice.config.values`: the kinds of values, each with its accepted forms and bounds;
* :mod:`~sluice.config.sources`: the layers (pyproject, sluice.toml, environment) and merging;
* :mod:`~sluice.config.up`: ``up.json``, what a running ``sluice up`` tells other processes.

What the rest of sluice reads is re-exported here.
"""

from sluice.config.declare import setting, setting_keys
from sluice.config.settings import Section, Settings, fallback_memory
from sluice.config.sources import GPU_COUNT_ENV, GPU_MEMORY_ENV
from sluice.config.up import UpState, embedded_broker_url, embedded_state_path

__all__ = [
    "GPU_COUNT_ENV",
    "GPU_MEMORY_ENV",
    "Section",
    "Settings",
    "UpState",
    "embedded_broker_url",
    "embedded_state_path",
    "fallback_memory",
    "setting",
    "setting_keys",
]
