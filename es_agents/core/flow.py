"""Flow control: how many of an agent's runs may be active at once, and who goes
next when a place frees.

An *active* run is one taking steps. A run that waits -- for a person, a timer, a
message -- is a row and holds no place; when it is woken it needs a place again.
An agent's ``Limits`` bound its active runs in all (``max_active``) and per tenant
(``max_active_per_tenant``, or a named tenant's own limit in ``tenants``; a run's
tenant is given at its start, and runs started without one share the tenant
``None``).

A run that finds no place waits with the reason ``queued``: a pause like any
other, in its log, with its tenant and priority in the detail. The places and the
queue are rows of the store (``ports.Flow``); ``admit`` below decides, purely,
which queued runs take the places that are free: the highest priority first, in
the order they queued within a priority, passing over a run whose tenant is at its
own limit (it keeps its place in the queue).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

QUEUED = "queued"  # the waiting reason of a run that waits for a place
ADMITTED = "admitted"  # the reason of its resumption when it is given one
FLOW_KEY = "flow"  # the state variable a start's tenant and priority are kept in
MAX_PRIORITY = 1_000_000


class InvalidLimits(ValueError):
    pass


def _whole(name: str, value: object) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or value < 1
    ):
        raise InvalidLimits(f"{name} must be a whole number ≥ 1, not {value!r}")


@dataclass(frozen=True)
class Limits:
    """At most ``max_active`` runs of the agent take steps at once, at most
    ``max_active_per_tenant`` of one tenant -- or, for a tenant named in
    ``tenants``, its own number; None: no such limit."""

    max_active: int | None = None
    max_active_per_tenant: int | None = None
    tenants: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_active", "max_active_per_tenant"):
            _whole(name, getattr(self, name))
        if not isinstance(self.tenants, Mapping):
            raise InvalidLimits(f"tenants must map tenant to limit: {self.tenants!r}")
        for tenant, value in self.tenants.items():
            check_tenant(tenant)
            _whole(f"the limit of tenant {tenant!r}", value)

    @property
    def limited(self) -> bool:
        return (
            self.max_active is not None
            or self.max_active_per_tenant is not None
            or bool(self.tenants)
        )

    def of_tenant(self, tenant: str | None) -> int | None:
        """How many runs of ``tenant`` may be active at once (None: no limit)."""
        if tenant is not None and tenant in self.tenants:
            return self.tenants[tenant]
        return self.max_active_per_tenant


NO_LIMITS = Limits()


@dataclass(frozen=True)
class Queued:
    """A run waiting for a place: ``seq`` is its place in the queue (arrival
    order), ``since_seq`` the sequence number of its ``queued`` pause."""

    run_id: str
    tenant: str | None
    priority: int
    seq: int
    since_seq: int


def check_priority(priority: object) -> int:
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or abs(priority) > MAX_PRIORITY
    ):
        raise InvalidLimits(
            f"priority must be a whole number from -{MAX_PRIORITY} to "
            f"{MAX_PRIORITY}, not {priority!r}"
        )
    return priority


def check_tenant(tenant: object) -> str | None:
    if tenant is None:
        return None
    if not isinstance(tenant, str) or not 0 < len(tenant) <= 200:
        raise InvalidLimits(f"tenant must be a text of 1 to 200 characters: {tenant!r}")
    return tenant


def flow_of(vars_: Mapping[str, Any]) -> tuple[str | None, int]:
    """A run's tenant and priority, from its state variables."""
    kept = vars_.get(FLOW_KEY)
    if not isinstance(kept, dict):
        return None, 0
    tenant = kept.get("tenant")
    priority = kept.get("priority", 0)
    return (
        tenant if isinstance(tenant, str) else None,
        priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
    )


def order(queue: Sequence[Queued]) -> list[Queued]:
    """The queue in the order places are given: priority first, then arrival."""
    return sorted(queue, key=lambda q: (-q.priority, q.seq))


def may_take(
    limits: Limits,
    active: int,
    active_of_tenant: int,
    tenant: str | None = None,
) -> bool:
    """Whether one more run of ``tenant`` (with ``active_of_tenant`` active) fits."""
    if limits.max_active is not None and active >= limits.max_active:
        return False
    own = limits.of_tenant(tenant)
    return not (own is not None and active_of_tenant >= own)


def admit(
    queue: Sequence[Queued],
    active: Mapping[str | None, int],
    limits: Limits,
) -> list[Queued]:
    """The queued runs that take the free places now, in the order given; ``active``:
    the places held, by tenant."""
    held = Counter(active)
    total = sum(held.values())
    taken: list[Queued] = []
    for q in order(queue):
        if limits.max_active is not None and total >= limits.max_active:
            break
        if may_take(limits, total, held[q.tenant], q.tenant):
            taken.append(q)
            held[q.tenant] += 1
            total += 1
    return taken


def ahead(queue: Sequence[Queued], run_id: str, priority: int) -> bool:
    """Whether a queued run other than ``run_id`` comes before a run of
    ``priority`` (``run_id``'s own place, when it is queued, counts as its
    arrival): then a new run queues behind it rather than take a free place."""
    mine = next((q for q in queue if q.run_id == run_id), None)
    for q in queue:
        if q.run_id == run_id:
            continue
        if q.priority > priority or (
            q.priority == priority and (mine is None or q.seq < mine.seq)
        ):
            return True
    return False
