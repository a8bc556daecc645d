"""Settings: one frozen object read from env ``SLUICE_*`` over ``sluice.toml`` over pyproject.

This package re-exports what the rest of sluice reads from it; see :mod:`sluice.config.settings`.
"""

from sluice.config.settings import (
    GPU_COUNT_ENV,
    GPU_MEMORY_ENV,
    SETTING_KEYS,
    Section,
    Settings,
    bounded,
    embedded_broker_url,
    embedded_state_path,
    fallback_memory,
    flag,
    fraction,
    names,
    path,
)

__all__ = ["GPU_COUNT_ENV", "GPU_MEMORY_ENV", "SETTING_KEYS", "Section", "Settings", "bounded", "embedded_broker_url",
           "embedded_state_path", "fallback_memory", "flag", "fraction", "names", "path"]
