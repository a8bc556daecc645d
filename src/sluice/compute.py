"""Compute: the cpu, memory and gpu a task declares, parsed once into canonical ints."""

from __future__ import annotations

from typing import Any

from sluice.errors import ConfigurationError
from sluice.units import format_cpu, format_memory, parse_cpu, parse_memory

#: More GPUs than any one machine has: a larger count is a typo.
MAX_GPUS = 1024
#: ``Compute(memory=AUTO)``: memory learned from the task's runs.
AUTO = "auto"
GPU_FORMS = f'a whole count from 0 to {MAX_GPUS} as an int or a string (0, 1, "2")'


def parse_gpu(value: object) -> int:
    """A whole, non-negative gpu count; ``"1"`` and ``1`` both mean one GPU."""
    if isinstance(value, bool):
        raise ConfigurationError(f"gpu {value!r} is not a count; use {GPU_FORMS}")
    text = value.strip() if isinstance(value, str) else None
    count = int(text) if text and len(text) <= 4 and text.isascii() and text.isdigit() else value
    if isinstance(count, int) and 0 <= count <= MAX_GPUS:
        return count
    raise ConfigurationError(f"gpu {value!r} is not a count; use {GPU_FORMS}")


class Compute:
    """What one task needs: ``Compute(cpu="4", memory="32Gi", gpu=1)``.

    Frozen and hashable. Any axis left ``None`` is inherited from a default with
    :meth:`inherit`, so ``Compute(memory="32Gi")`` bumps only memory. Values are validated
    here, at construction, so a typo fails where the task is declared. ``memory="auto"`` asks
    for memory learned from the task's own runs (``auto_memory``; ``memory_bytes`` stays None
    until the app resolves it, see ``sluice.tasks.memory_profile``).
    """

    __slots__ = ("millicores", "memory_bytes", "gpu", "auto_memory")

    millicores: int | None
    memory_bytes: int | None
    gpu: int | None
    auto_memory: bool

    def __init__(
        self, cpu: str | int | float | None = None, memory: str | int | None = None, gpu: str | int | None = None
    ) -> None:
        auto = isinstance(memory, str) and memory.strip() == AUTO
        object.__setattr__(self, "millicores", None if cpu is None else parse_cpu(cpu))
        try:
            object.__setattr__(self, "memory_bytes", None if memory is None or auto else parse_memory(memory))
        except ConfigurationError as exc:
            raise ConfigurationError(f'{exc}; or "{AUTO}" (learned from the task\'s runs)') from None
        object.__setattr__(self, "gpu", None if gpu is None else parse_gpu(gpu))
        object.__setattr__(self, "auto_memory", auto)

    @classmethod
    def of(cls, millicores: int | None = None, memory_bytes: int | None = None, gpu: int | None = None) -> Compute:
        """Build from canonical ints (millicores, bytes, count)."""
        return cls(cpu=None if millicores is None else f"{millicores}m", memory=memory_bytes, gpu=gpu)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Compute, (self.cpu, self.memory, self.gpu))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Compute is frozen; use inherit() or replace() to derive a new one ({name})")

    @property
    def cpu(self) -> str | None:
        """The cpu axis as a canonical Kubernetes string ("4", "500m")."""
        return None if self.millicores is None else format_cpu(self.millicores)

    @property
    def memory(self) -> str | None:
        """The memory axis as a canonical Kubernetes string ("32Gi"), or "auto"."""
        if self.auto_memory:
            return AUTO
        return None if self.memory_bytes is None else format_memory(self.memory_bytes)

    @classmethod
    def _validated(
        cls, millicores: int | None, memory_bytes: int | None, gpu: int | None, auto_memory: bool
    ) -> Compute:
        """From axes taken from Computes (so already valid), without parsing them again: every
        message a worker runs derives its compute with :meth:`inherit`."""
        compute = object.__new__(cls)
        for name, value in zip(cls.__slots__, (millicores, memory_bytes, gpu, auto_memory)):
            object.__setattr__(compute, name, value)
        return compute

    def inherit(self, default: Compute) -> Compute:
        """Fill each unset axis from ``default``; set axes (``memory="auto"`` too) win."""
        own_memory = self.memory_bytes is not None or self.auto_memory
        return Compute._validated(
            self.millicores if self.millicores is not None else default.millicores,
            self.memory_bytes if own_memory else default.memory_bytes,
            self.gpu if self.gpu is not None else default.gpu,
            self.auto_memory if own_memory else default.auto_memory,
        )

    def replace(self, *, memory_bytes: int | None = None) -> Compute:
        """A copy with the given axes changed (escalation grows memory this way)."""
        return Compute.of(self.millicores, memory_bytes if memory_bytes is not None else self.memory_bytes, self.gpu)

    @property
    def gpus(self) -> int:
        """The gpu count with unset read as zero."""
        return self.gpu or 0

    def fits_in(self, slot: Compute) -> bool:
        """True when every set axis of this compute is at most the slot's (unset slot axes hold nothing)."""
        return (
            (self.millicores or 0) <= (slot.millicores or 0)
            and (self.memory_bytes or 0) <= (slot.memory_bytes or 0)
            and self.gpus <= slot.gpus
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form with canonical strings, for message headers and manifests."""
        return {k: v for k, v in (("cpu", self.cpu), ("memory", self.memory), ("gpu", self.gpu)) if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Compute:
        """Inverse of :meth:`to_dict`; unknown keys are an error naming them."""
        unknown = set(data) - {"cpu", "memory", "gpu"}
        if unknown:
            raise ConfigurationError(f"unknown compute axes {sorted(unknown)}; accepted: cpu, memory, gpu")
        return cls(**data)

    def _key(self) -> tuple[int | None, int | None, int | None, bool]:
        return (self.millicores, self.memory_bytes, self.gpu, self.auto_memory)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compute) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        parts = [f"cpu={self.cpu!r}"] if self.cpu is not None else []
        parts += [f"memory={self.memory!r}"] if self.memory is not None else []
        parts += [f"gpu={self.gpu}"] if self.gpu is not None else []
        return f"Compute({', '.join(parts)})"

    def describe(self) -> str:
        """Short human form for logs and tables: ``cpu=4 memory=32Gi gpu=1``."""
        return " ".join(f"{k}={v}" for k, v in self.to_dict().items()) or "(unset)"
