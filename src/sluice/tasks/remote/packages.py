"""Package lists of remote functions: PEP 508 requirements, normalized as the package index does.

The client normalizes at decoration time and the worker normalizes again for every call, with
the same function, so both sides agree on what a list means and on its cache key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from sluice.errors import InvalidPackageError

ACCEPTED = (
    'a PEP 508 requirement: a bare name ("requests"), a pin ("numpy==1.26.0"), '
    'a range ("pandas>=2,<3") or extras ("requests[socks]>=2.31")'
)


def normalize_packages(entries: Iterable[object] | None) -> tuple[str, ...]:
    """Validate, de-duplicate by canonical name (the first spelling is kept) and sort.

    ``["Requests", "requests==2.31"]`` -> ``("Requests",)``; ``"scikit_learn"`` and
    ``"scikit-learn"`` are one entry. A malformed entry raises :class:`InvalidPackageError`.
    """
    if entries is None:
        return ()
    if isinstance(entries, (str, bytes)):
        raise InvalidPackageError(
            f"packages={entries!r} must be a list of requirements, not one string; each entry is {ACCEPTED}"
        )
    if not isinstance(entries, (list, tuple, set, frozenset)):
        raise InvalidPackageError(f"packages={entries!r} must be a list of requirements; each entry is {ACCEPTED}")
    kept: dict[str, str] = {}
    for entry in entries:
        kept.setdefault(canonicalize_name(parse_requirement(entry).name), str(entry).strip())
    return tuple(kept[name] for name in sorted(kept))


def parse_requirement(entry: object) -> Requirement:
    """One entry -> a :class:`packaging.requirements.Requirement`; URLs and markers are refused."""
    if not isinstance(entry, str) or not entry.strip():
        raise InvalidPackageError(f"package {entry!r} is not a requirement; use {ACCEPTED}")
    try:
        requirement = Requirement(entry.strip())
    except InvalidRequirement as exc:
        raise InvalidPackageError(
            f"package {entry!r} is not a requirement ({str(exc).splitlines()[0]}); use {ACCEPTED}"
        ) from None
    if requirement.url or requirement.marker:
        raise InvalidPackageError(f"package {entry!r} uses a URL or an environment marker; use {ACCEPTED}")
    if any(not spec.version for spec in requirement.specifier):
        raise InvalidPackageError(f"package {entry!r} has an operator without a version; use {ACCEPTED}")
    return requirement


@dataclass(frozen=True)
class InstallPlan:
    """What a worker installs for a package list: the entries left, and one line per entry dropped."""

    install: tuple[str, ...]
    ignored: tuple[str, ...]

    @property
    def key(self) -> str:
        """Content address of the environment: the same entries give the same key everywhere."""
        return environment_key(self.install)


def environment_key(entries: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()[:20]


def plan_install(entries: Iterable[str], provided: Mapping[str, str | None]) -> InstallPlan:
    """Leave out entries the base environment already provides, whatever version they ask for;
    entries with extras are kept so that their extra dependencies are installed.

    ``provided`` maps canonical names to installed versions (None when unknown).
    """
    install, ignored = [], []
    for entry in normalize_packages(entries):
        requirement = parse_requirement(entry)
        name = canonicalize_name(requirement.name)
        if name in provided and not requirement.extras:
            version = provided[name]
            ignored.append(
                f"ignored {entry}: already provided by the base image" + (f" (version {version})" if version else "")
            )
        else:
            install.append(entry)
    return InstallPlan(tuple(install), tuple(ignored))
