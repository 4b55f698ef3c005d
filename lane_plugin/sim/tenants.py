"""Tenants in ``lane simulate``: who each job belongs to, their counters, and how fairly a policy served them.

The ``lane`` policy admits by :mod:`lane_plugin.policy.fairness` (the Virtual Token Counter, the very
code the ledger runs); the baselines ignore tenants. For every policy the :class:`TenantBook` keeps the
same counters the ledger keeps (tokens admitted / weight, trued up at settlement, returning tenants
lifted), so their fairness is measured alike: the largest weighted-service gap between two tenants both
backlogged (sampled at every tick), and Jain's index over the weighted tokens admitted while at least two
tenants were backlogged. Per tenant: tokens served, waits p50/p99, runs finished.
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Sequence

from ..errors import TraceError
from ..policy.fairness import DEFAULT_TENANT, MAX_WEIGHT, MIN_WEIGHT, TenantState, lift


def parse_tenants(spec: str) -> list[tuple[str, float, float]]:
    """``NAME:WEIGHT:SHARE,...`` as ``[(name, weight, share)]``; shares are normalised to sum to 1.

    Example:
        >>> parse_tenants("backfill:1:0.9,interactive:4:0.1")
        [('backfill', 1.0, 0.9), ('interactive', 4.0, 0.1)]
    """
    out: list[tuple[str, float, float]] = []
    for part in spec.split(","):
        bits = part.strip().split(":")
        if len(bits) != 3 or not bits[0]:
            raise TraceError(
                f"tenants={spec!r}: expected NAME:WEIGHT:SHARE,... (e.g. backfill:1:0.9,interactive:4:0.1)"
            )
        try:
            weight, share = float(bits[1]), float(bits[2])
        except ValueError:
            raise TraceError(f"tenants={spec!r}: weight and share of {bits[0]!r} must be numbers") from None
        if not MIN_WEIGHT <= weight <= MAX_WEIGHT:
            raise TraceError(f"tenants={spec!r}: weight {weight:g} of {bits[0]!r} must be from 1 to 1000")
        if not 0 < share < float("inf"):  # nan and inf too: an infinite share would leave every other share nan
            raise TraceError(f"tenants={spec!r}: share {share:g} of {bits[0]!r} must be > 0")
        out.append((bits[0], weight, share))
    if len({n for n, _, _ in out}) != len(out):
        raise TraceError(f"tenants={spec!r}: a tenant is named twice")
    total = sum(s for _, _, s in out)
    if total == float("inf"):  # each finite, their sum not (1e308 twice): every share would be 0
        raise TraceError(f"tenants={spec!r}: the shares add up past a float's range; give them as fractions")
    return [(n, w, s / total) for n, w, s in out]


def pick(tenants: Sequence[tuple[str, float, float]], u: float) -> str:
    """The tenant whose share covers ``u`` in [0, 1)."""
    acc = 0.0
    for name, _, share in tenants:
        acc += share
        if u < acc:
            return name
    return tenants[-1][0]


def assign_by_hash(keys: Sequence[str], tenants: Sequence[tuple[str, float, float]]) -> list[str]:
    """A tenant per key (a run key or a request id), by hashing it (crc32): stable, and as the shares say."""
    return [pick(tenants, zlib.crc32(k.encode()) / 2**32) for k in keys]


class TenantBook:
    """The counters of one policy's run, per tenant (see the module's docstring)."""

    def __init__(self, tenant: Sequence[str | None], weights: dict[str, float]) -> None:
        self.of = [t or DEFAULT_TENANT for t in tenant]
        names = sorted(set(self.of))
        self.weights = {n: float(weights.get(n, 1.0)) for n in names}
        self.served = {n: 0.0 for n in names}
        self.waiting = {n: 0 for n in names}
        self.tokens = {n: 0 for n in names}
        self.backlogged: set[str] = set()
        self.gap = 0.0  # the largest weighted-service gap between two backlogged tenants
        self.fair_tokens = {n: 0.0 for n in names}  # weighted tokens admitted while >= 2 were backlogged
        self.contended: set[str] = set()  # tenants backlogged at some tick beside another
        # Each tenant's waiting jobs by (place in the order, index), lazy deletion: its index head, as the
        # store's ix_job_tenant_queue (the lane policy reads it for a tenant the lane's merged head is short of).
        self.queues: dict[str, list[tuple[float, int]]] = {n: [] for n in names}

    @property
    def several(self) -> bool:
        return len(self.served) > 1

    def wait(self, j: int, prio: float = 0.0) -> None:
        self.waiting[self.of[j]] += 1
        heapq.heappush(self.queues[self.of[j]], (prio, j))

    def head(self, tenant: str, n: int, waiting_state: int, state: bytearray) -> list[int]:
        """The first ``n`` waiting jobs of ``tenant`` in the order (stale entries dropped on the way)."""
        q, out, back = self.queues[tenant], [], []
        seen: set[int] = set()
        while q and len(out) < n:
            e = heapq.heappop(q)
            if state[e[1]] != waiting_state or e[1] in seen:
                continue
            seen.add(e[1])
            out.append(e[1])
            back.append(e)
        for e in back:
            heapq.heappush(q, e)
        return out

    def leave(self, j: int) -> None:
        self.waiting[self.of[j]] -= 1

    def tick(self) -> None:
        """Before a policy chooses: who is backlogged now (returning tenants lifted), and the gap."""
        now = {n for n, k in self.waiting.items() if k > 0}
        for n, v in lift(self.served, self.backlogged, now).items():
            self.served[n] = v
        self.backlogged = now
        if len(now) > 1:
            self.contended |= now
            vals = [self.served[n] for n in now]
            self.gap = max(self.gap, max(vals) - min(vals))

    def states(self) -> dict[str, TenantState]:
        return {n: TenantState(weight=self.weights[n], served=self.served[n]) for n in self.served}

    def lease(self, j: int, est: int) -> None:
        n = self.of[j]
        self.waiting[n] -= 1
        self.served[n] += est / self.weights[n]
        if len(self.backlogged) > 1 and n in self.backlogged:
            self.fair_tokens[n] += est / self.weights[n]

    def settle(self, j: int, est: int, actual: int) -> None:
        n = self.of[j]
        self.served[n] += (actual - est) / self.weights[n]
        self.tokens[n] += actual

    def jain(self) -> float | None:
        """Jain's index of the weighted tokens admitted while at least two tenants were backlogged (1: fair)."""
        xs = [self.fair_tokens[n] for n in self.contended]
        if len(xs) < 2 or not any(xs):
            return None
        return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))
