"""Tenants: who a task call belongs to, and the share of a resource class each one is given.

A call's tenant is, first found: ``apply_async(tenant=...)`` (or ``delay_many(tenant=...)``),
the innermost ``with sluice.tenant(...)``, the App's ``tenant=`` default, else
:data:`DEFAULT_TENANT`. It travels in the ``sluice_tenant`` header (``sluice.headers``), and a
message of a tenant other than the default one waits on its own queue, :func:`tenant_queue`
(the class's name, then ``~``, then the tenant), so kombu keeps it, restores it and
counts it as any queue, with its priority lists. Workers consume the class; the fetch script
picks which tenant's line a worker takes from next (``sluice.queues.broker.lua.fetch``).
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sluice.compute import Compute
from sluice.errors import ConfigurationError, OverQuota

#: The tenant of a call that names none (its messages wait on the class's own queue).
DEFAULT_TENANT = "default"
#: Between a class and a tenant in a tenant's queue name: no class name holds it (see catalog),
#: and unlike ``:`` or ``.`` hardly any Celery queue name does.
TENANT_SEPARATOR = "~"
MAX_TENANT_LENGTH = 64
#: The largest weight a tenant may be given (a larger one is a typo).
MAX_WEIGHT = 1000
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
TENANT_FORMS = f"1 to {MAX_TENANT_LENGTH} ASCII letters, digits, '.', '_' or '-', starting with a letter or digit"
SHARE_KEYS = ("weight", "quota")

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("sluice_tenant", default=None)


def is_tenant(name: object) -> bool:
    """Whether ``name`` is a valid tenant name (``fetch.lua`` reads a header by the same rule)."""
    return isinstance(name, str) and len(name) <= MAX_TENANT_LENGTH and _NAME.fullmatch(name) is not None


def check_tenant(name: object) -> str:
    """``name`` if it is a valid tenant name, else a ConfigurationError naming it."""
    if not is_tenant(name):
        raise ConfigurationError(f"tenant {name!r} is not a valid tenant name; use {TENANT_FORMS}")
    return str(name)


@contextmanager
def tenant(name: str) -> Iterator[str]:
    """Calls made inside belong to tenant ``name`` (unless a call names its own): for code that
    calls ``.delay()`` and cannot pass ``tenant=`` through."""
    token = _current.set(check_tenant(name))
    try:
        yield name
    finally:
        _current.reset(token)


def current_tenant() -> str | None:
    """The tenant of the innermost ``with tenant(...)``, or None outside one."""
    return _current.get()


def tenant_queue(queue: str, tenant: str) -> str:
    """The queue a ``tenant``'s messages for class ``queue`` wait on (the class's own for the default tenant)."""
    return queue if tenant == DEFAULT_TENANT else f"{queue}{TENANT_SEPARATOR}{tenant}"


def split_queue(name: str) -> tuple[str, str]:
    """``(class queue, tenant)`` of a queue name :func:`tenant_queue` made (any other: the default tenant)."""
    queue, separator, tenant = name.partition(TENANT_SEPARATOR)
    return (queue, tenant) if separator and is_tenant(tenant) else (name, DEFAULT_TENANT)


@dataclass(frozen=True)
class Share:
    """What one tenant is given on one class: ``weight`` (its fair share against the others'
    under contention) and ``quota`` (the most its running tasks may hold there, per axis set;
    None: no cap)."""

    weight: float = 1
    quota: Compute | None = None

    def __post_init__(self) -> None:
        weight = self.weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= MAX_WEIGHT:
            raise ConfigurationError(
                f"weight={weight!r} must be a number above 0 and at most {MAX_WEIGHT} "
                "(a tenant that may not run here needs no share: leave it out, or give it a quota)"
            )
        if self.quota is not None and self.quota.auto_memory:
            raise ConfigurationError('a quota\'s memory is a size, not "auto"')

    @classmethod
    def from_mapping(cls, where: str, data: Any) -> Share:
        """From a config table ``{weight = 3, quota = {gpu = 4, memory = "256Gi"}}``."""
        if isinstance(data, Share):
            return data
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"{where} must be a table of {', '.join(SHARE_KEYS)}, not {data!r}")
        unknown = set(data) - set(SHARE_KEYS)
        if unknown:
            raise ConfigurationError(f"{where}: unknown keys {sorted(unknown)}; accepted: {', '.join(SHARE_KEYS)}")
        quota = data.get("quota")
        if quota is not None and not isinstance(quota, Compute):
            if not isinstance(quota, Mapping) or set(quota) - {"cpu", "memory", "gpu"}:
                raise ConfigurationError(f"{where}: quota={quota!r} must be a table of cpu, memory, gpu")
            quota = Compute(**quota)
        try:
            return cls(weight=data.get("weight", 1), quota=quota)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None

    def refusal(self, task: str, compute: Compute, queue: str, tenant: str) -> OverQuota | None:
        """The error for a task of effective ``compute`` that could never start under this
        share's quota on class ``queue`` (None when it could): at publish (the router) or, for a
        plain producer's message, at admission on the worker."""
        over = self.over_quota(compute)
        if not over or self.quota is None:
            return None
        return OverQuota(
            f"task {task} needs {compute.describe()} on {queue}, more than tenant {tenant!r}'s quota there "
            f"({self.quota.describe()}) allows on {', '.join(over)}: it could never start; raise the quota, "
            "or send it as another tenant"
        )

    def over_quota(self, used: Compute) -> list[str]:
        """The axes on which ``used`` (canonical ints on every axis) is over this share's quota."""
        quota = self.quota
        if quota is None:
            return []
        pairs = (
            ("cpu", used.millicores, quota.millicores),
            ("memory", used.memory_bytes, quota.memory_bytes),
            ("gpu", used.gpu, quota.gpu),
        )
        return [axis for axis, have, cap in pairs if cap is not None and (have or 0) > cap]
