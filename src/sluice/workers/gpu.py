"""How many GPUs this machine has (``SLUICE_GPU_COUNT`` overrides, for tests and development)."""

from __future__ import annotations

import os
import shutil
import subprocess

from sluice.config import GPU_COUNT_ENV, GPU_MEMORY_ENV
from sluice.errors import ConfigurationError
from sluice.units import parse_size


def gpu_count() -> int:
    """GPUs visible here: ``SLUICE_GPU_COUNT`` if set, else the lines of ``nvidia-smi -L``, else 0."""
    override = os.environ.get(GPU_COUNT_ENV)
    if override is not None:
        if not (override.strip().isascii() and override.strip().isdigit()):
            raise ConfigurationError(f"SLUICE_GPU_COUNT={override!r} must be a whole number of GPUs")
        return int(override)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def gpu_memory() -> int | None:
    """Bytes of memory of the smallest GPU here (``SLUICE_GPU_MEMORY`` overrides); None if unknown."""
    override = os.environ.get(GPU_MEMORY_ENV)
    if override:
        return parse_size(override, "SLUICE_GPU_MEMORY")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    sizes = [int(line.strip()) << 20 for line in out.splitlines() if line.strip().isdigit()]  # MiB
    return min(sizes) if sizes else None
