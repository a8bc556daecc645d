"""Every ``sluice_*`` message header, and the one parser and encoder of them.

Celery hands a message's custom headers to the worker as attributes of ``task.request`` (and in
the worker ``Request``'s ``request_dict``); :meth:`Headers.read` takes either. Precedence, where
they are used: a header wins over the task's own options, which win over the app's defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice.compute import Compute
from sluice.tasks.retry import RetryPolicy

#: The attempt number (1-based) a message carries; a retry publishes attempt + 1.
ATTEMPT = "sluice_attempt"
#: A per-message compute (set when a retry escalates it, or by a batch run or remote call).
COMPUTE = "sluice_compute"
#: A per-message retry policy (asset steps and batch chunks share one task each).
POLICY = "sluice_retry"
#: The message's home queue: retries go back to the same worker (its worker_direct queue) while
#: that worker lives, else to the home queue.
STICKY = "sluice_sticky"
#: A retried remote call: the memory limit its fresh sandbox starts at, and why it was retried.
REMOTE_START = "sluice_remote_start"
REMOTE_REASON = "sluice_remote_reason"
#: The queues a worker forwarded this message from (admission), oldest first: a forward to a
#: queue already in it is a loop, and ends the task instead.
FORWARDED = "sluice_forwarded"
#: The tenant a call belongs to (``sluice.tenants``; absent: the default tenant). Plain Celery
#: producers may set it too.
TENANT = "sluice_tenant"
#: What the message's task holds while it runs, as the fetch script counts it against its
#: tenant's share and quota: "<millicores> <bytes> <gpus>" of its effective compute (absent: one
#: slot of its class). Set at publish by the router (``sluice.queues.routing``).
CHARGE = "sluice_charge"
#: A unique call's idempotency key and how long its claim lasts, "<ttl> <key>" (``sluice.tasks.unique``):
#: the worker renews the claim as the task starts and ends.
UNIQUE = "sluice_unique"
#: The limits a message's call is held to, ``[[id, most running, seconds between starts], ...]``
#: (0: none of that kind; ``sluice.tasks.limits``): the fetch script takes it only while each
#: has room.
LIMITS = "sluice_limits"
#: When a message with a priority was published (seconds since the epoch): the fetch script takes
#: it ahead of higher priorities once it has waited ``priority_max_wait`` (priority aging).
SENT = "sluice_sent"


@dataclass(frozen=True)
class Headers:
    """The sluice headers of one message, parsed; absent ones are None (attempt defaults to 1)."""

    attempt: int = 1
    compute: Compute | None = None
    policy: RetryPolicy | None = None
    sticky: str | None = None
    remote_start: int | None = None
    remote_reason: str | None = None
    forwarded: tuple[str, ...] = ()
    tenant: str | None = None

    @classmethod
    def read(cls, source: Mapping[str, Any] | Any) -> Headers:
        """From message headers or a ``request_dict`` (a mapping), or from a request (attributes)."""
        fields = source if isinstance(source, Mapping) else vars(source)
        compute, policy, start = fields.get(COMPUTE), fields.get(POLICY), fields.get(REMOTE_START)
        return cls(
            attempt=attempt_of(fields),
            compute=Compute.from_dict(compute) if compute else None,
            policy=RetryPolicy.from_dict(policy) if policy else None,
            sticky=fields.get(STICKY) or None,
            remote_start=int(start) if start else None,
            remote_reason=fields.get(REMOTE_REASON) or None,
            forwarded=tuple(str(q) for q in fields.get(FORWARDED) or ()),
            tenant=fields.get(TENANT) or None,
        )

    def encode(self) -> dict[str, Any]:
        """The headers to publish (only the ones set; attempt 1 is implied)."""
        values = {
            ATTEMPT: self.attempt if self.attempt != 1 else None,
            COMPUTE: self.compute.to_dict() if self.compute is not None else None,
            POLICY: self.policy.to_dict() if self.policy is not None else None,
            STICKY: self.sticky,
            REMOTE_START: self.remote_start,
            REMOTE_REASON: self.remote_reason,
            FORWARDED: list(self.forwarded) or None,
            TENANT: self.tenant,
        }
        return {name: value for name, value in values.items() if value is not None}


def attempt_of(source: Mapping[str, Any] | Any) -> int:
    """The attempt number of a message (headers, a ``request_dict`` or a request), without
    parsing its other headers: it is read for every task the worker runs."""
    fields = source if isinstance(source, Mapping) else vars(source)
    return int(fields.get(ATTEMPT) or 1)


def encode_charge(compute: Compute) -> str:
    """The :data:`CHARGE` header of a task of effective ``compute`` (the fetch script reads it)."""
    return f"{compute.millicores or 0} {compute.memory_bytes or 0} {compute.gpus}"


def decode_charge(text: str) -> Compute:
    """The compute a :data:`CHARGE` header says (canonical ints on every axis)."""
    millicores, memory_bytes, gpus = (int(part) for part in text.split())
    return Compute.of(millicores, memory_bytes, gpus)
