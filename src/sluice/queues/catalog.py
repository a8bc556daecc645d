"""The catalog of resource classes: each class is one Celery queue with a per-slot size.

Classes form a ladder ordered by size (gpu, then memory, then cpu); routing walks it from the
bottom and takes the first class whose slot holds the task.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sluice.compute import Compute
from sluice.errors import ConfigurationError, NoQueueFits
from sluice.tenants import Share, check_tenant

CLASS_KEYS = ("cpu", "memory", "gpu", "slots", "min_replicas", "max_replicas", "pack", "tenants", "enabled")


@dataclass(frozen=True)
class ResourceClass:
    """One queue: tasks routed here get a slot of ``slot`` size; a worker has ``slots`` of them.

    ``pack=True``: ``slot`` is the whole worker's size instead, and the worker runs as many tasks
    at once as fit it by their own effective compute, at most ``slots`` (``sluice.workers.packing``).

    ``tenants``: the :class:`~sluice.tenants.Share` (weight, quota) of each named tenant here;
    a tenant not named has weight 1 and no quota (see ``share``).
    """

    name: str
    slot: Compute
    slots: int = 1
    min_replicas: int = 0
    max_replicas: int = 10
    pack: bool = False
    tenants: tuple[tuple[str, Share], ...] = ()

    def __post_init__(self) -> None:
        shares = self.tenants.items() if isinstance(self.tenants, Mapping) else self.tenants
        object.__setattr__(
            self,
            "tenants",
            tuple(
                sorted(
                    (check_tenant(name), Share.from_mapping(f"resource class {self.name!r} tenant {name!r}", share))
                    for name, share in shares
                )
            ),
        )
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ConfigurationError(
                f"resource class name {self.name!r} is not valid; use letters, digits, '-' and '_'"
            )
        if self.slot.millicores is None or self.slot.memory_bytes is None:
            raise ConfigurationError(f"resource class {self.name!r} needs both cpu and memory, got {self.slot!r}")
        for field in ("slots", "min_replicas", "max_replicas"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (field == "slots" and value == 0):
                raise ConfigurationError(
                    f"resource class {self.name!r}: {field}={value!r} must be a whole number"
                    + (" of at least 1" if field == "slots" else " of at least 0")
                )
        if not isinstance(self.pack, bool):
            raise ConfigurationError(f"resource class {self.name!r}: pack={self.pack!r} must be true or false")
        try:
            self.worker_size  # noqa: B018 - computed to check it: the slots times the slot must be a compute
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"resource class {self.name!r}: slots={self.slots} of {self.slot.describe()} make a worker "
                f"larger than a compute can be ({exc}); use fewer slots"
            ) from None
        if self.min_replicas > self.max_replicas:
            raise ConfigurationError(
                f"resource class {self.name!r}: min_replicas={self.min_replicas} "
                f"exceeds max_replicas={self.max_replicas}"
            )

    def share(self, tenant: str) -> Share:
        """What ``tenant`` is given here (weight 1, no quota, when the class does not name it)."""
        return dict(self.tenants).get(tenant, Share())

    def fetch_terms(self) -> tuple[str, str]:
        """What the fetch script needs of this class (``lua/fetch.lua``): one slot's charge, and
        each named tenant's ``<name> <weight> <cpu cap> <memory cap> <gpu cap>`` ("-": no cap)."""
        slot = f"{self.slot.millicores or 0} {self.slot.memory_bytes or 0} {self.slot.gpus}"
        terms = []
        for name, share in self.tenants:
            quota = share.quota
            caps = (quota.millicores, quota.memory_bytes, quota.gpu) if quota is not None else (None, None, None)
            terms.append(" ".join([name, repr(float(share.weight)), *("-" if c is None else str(c) for c in caps)]))
        return slot, " ".join(terms)

    @property
    def is_gpu(self) -> bool:
        return self.slot.gpus > 0

    @property
    def worker_size(self) -> Compute:
        """What one worker (one pod) holds: the slot times the slots, or for a packed class the slot."""
        if self.pack:
            return self.slot
        return Compute.of(
            (self.slot.millicores or 0) * self.slots,
            (self.slot.memory_bytes or 0) * self.slots,
            self.slot.gpus * self.slots,
        )

    def describe(self) -> str:
        packed = f", packed, up to {self.slots} at once" if self.pack else ""
        return f"{self.name} (cpu={self.slot.cpu} memory={self.slot.memory} gpu={self.slot.gpus}{packed})"

    @classmethod
    def from_mapping(cls, name: str, data: Mapping[str, Any], base: ResourceClass | None = None) -> ResourceClass:
        """Build from a config table; keys absent from ``data`` come from ``base`` (overriding a default)."""
        unknown = set(data) - set(CLASS_KEYS)
        if unknown:
            raise ConfigurationError(
                f"resource class {name!r}: unknown keys {sorted(unknown)}; accepted: {', '.join(CLASS_KEYS)}"
            )
        slot = Compute(
            cpu=data.get("cpu", base.slot.cpu if base else None),
            memory=data.get("memory", base.slot.memory if base else None),
            gpu=data.get("gpu", base.slot.gpus if base else 0),
        )
        fields = {k: data[k] for k in ("slots", "min_replicas", "max_replicas", "pack", "tenants") if k in data}
        if "tenants" in fields and not isinstance(fields["tenants"], Mapping):
            raise ConfigurationError(
                f"resource class {name!r}: tenants must be a table of tenant tables, "
                f'e.g. [classes.{name}.tenants.team-a] weight = 3, quota = {{gpu = 4, memory = "256Gi"}}'
            )
        if base is not None:
            return replace(base, slot=slot, **fields)
        return cls(name=name, slot=slot, **fields)


DEFAULT_CLASSES: tuple[ResourceClass, ...] = (
    ResourceClass("cpu", Compute(cpu="1", memory="2Gi", gpu=0), slots=4, max_replicas=20),
    ResourceClass("highmem", Compute(cpu="4", memory="64Gi", gpu=0), slots=1, max_replicas=4),
    ResourceClass("gpu", Compute(cpu="8", memory="64Gi", gpu=1), slots=1, max_replicas=2),
)


def _ladder_key(rc: ResourceClass) -> tuple[int, int, int, str]:
    return (rc.slot.gpus, rc.slot.memory_bytes or 0, rc.slot.millicores or 0, rc.name)


class Catalog:
    """An ordered, validated set of resource classes (smallest first)."""

    def __init__(self, classes: Iterable[ResourceClass]) -> None:
        ordered = sorted(classes, key=_ladder_key)
        if not ordered:
            raise ConfigurationError("the catalog has no resource classes; configure at least one")
        names = [rc.name for rc in ordered]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigurationError(f"resource class names must be unique; repeated: {', '.join(dupes)}")
        self._classes = tuple(ordered)
        self._by_name = {rc.name: rc for rc in ordered}

    @classmethod
    def merged(
        cls, overrides: Mapping[str, Mapping[str, Any]], base: Iterable[ResourceClass] = DEFAULT_CLASSES
    ) -> Catalog:
        """Apply config tables onto ``base`` by name: change a class, add one, or drop it with enabled=false."""
        classes = {rc.name: rc for rc in base}
        for name, table in overrides.items():
            if not isinstance(table, Mapping):
                raise ConfigurationError(f"resource class {name!r} must be a table of {', '.join(CLASS_KEYS)}")
            table = dict(table)
            enabled = table.pop("enabled", True)
            if not isinstance(enabled, bool):
                raise ConfigurationError(f"resource class {name!r}: enabled={enabled!r} must be true or false")
            if enabled is False:
                classes.pop(name, None)
                continue
            if name not in classes and set(table) <= {"tenants"}:
                raise ConfigurationError(
                    f"tenants given for unknown resource class {name!r}; classes: {', '.join(sorted(classes))}"
                )
            classes[name] = ResourceClass.from_mapping(name, table, classes.get(name))
        return cls(classes.values())

    def __iter__(self) -> Iterator[ResourceClass]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> list[str]:
        return [rc.name for rc in self._classes]

    def get(self, name: str) -> ResourceClass:
        """The class called ``name``; an unknown name is an error listing the classes."""
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigurationError(
                f"unknown resource class {name!r}; configured classes: {', '.join(self.names)}"
            ) from None

    def route(self, compute: Compute, task_name: str = "task") -> ResourceClass:
        """The smallest class whose slot fits every axis; tasks without gpu never take a gpu class."""
        for rc in self._classes:
            if rc.is_gpu and not compute.gpus:
                continue
            if compute.fits_in(rc.slot):
                return rc
        sizes = "; ".join(rc.describe() for rc in self._classes)
        raise NoQueueFits(f"no resource class fits {task_name} with {compute!r}; classes: {sizes}")

    @property
    def default_class(self) -> ResourceClass:
        """The smallest non-gpu class: where Celery's default queue points."""
        return next((rc for rc in self._classes if not rc.is_gpu), self._classes[0])
