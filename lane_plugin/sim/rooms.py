"""The waiting jobs' rooms for rule 12's exact per-job form (lane_plugin.policy.perjob), as a segment tree.

Each arrival gets the next position; its leaf holds its room ``key - O`` while it waits and :data:`NONE` once it
stops waiting. An admission lowers the room of every older position by its rate (a prefix add: those still
waiting were passed, the rest hold :data:`NONE` and stay above any room), so the least room over a range of
positions is one query. Lazy adds on the nodes, pushed down before a point is read or set.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush

# A leaf no job waits at: far above any room, and still so after every rate a run admits is taken off it.
NONE = 1 << 62


class RoomTree:
    """Rooms by arrival position: set at arrival, lowered by a prefix on each admission, cleared when a job leaves.

    ``position_of``: a waiting job's position from its id (None: not waiting), what the policy's
    :class:`~lane_plugin.policy.perjob.Rooms` asks.

    Example:
        >>> t = RoomTree(lambda jid: None)
        >>> for p, room in enumerate((50, 900, 400)): t.set(p, room)
        >>> t.lower(2, 30); t.least(0, 3), t.least(1, 3), t.room(1)
        (20, 400, 870)
        >>> t.clear(0); t.least(0, 2), t.least(0, 1)
        (870, None)
    """

    def __init__(self, position_of: Callable[[str], int | None], capacity: int = 1024) -> None:
        self.position = position_of
        self._n = 1
        while self._n < capacity:
            self._n *= 2
        self._h = self._n.bit_length() - 1
        self._t = [NONE] * (2 * self._n)  # node: the least of its leaves, its own pending add included
        self._d = [0] * self._n  # inner node: the add its children have not had yet

    def _apply(self, i: int, value: int) -> None:
        self._t[i] += value
        if i < self._n:
            self._d[i] += value

    def _build(self, i: int) -> None:
        t, d = self._t, self._d
        while i > 1:
            i >>= 1
            t[i] = min(t[2 * i], t[2 * i + 1]) + d[i]

    def _push(self, i: int) -> None:
        d = self._d
        for s in range(self._h, 0, -1):
            k = i >> s
            if d[k]:
                self._apply(2 * k, d[k])
                self._apply(2 * k + 1, d[k])
                d[k] = 0

    def _grow(self, position: int) -> None:
        leaves = [self.room(p) for p in range(self._n)]
        n = self._n
        while n <= position:
            n *= 2
        self._n, self._h = n, n.bit_length() - 1
        self._t, self._d = [NONE] * (2 * n), [0] * n
        self._t[n : n + len(leaves)] = leaves
        for i in range(n - 1, 0, -1):
            self._t[i] = min(self._t[2 * i], self._t[2 * i + 1])

    def room(self, position: int) -> int:
        """The room at ``position`` (:data:`NONE` or above: no job waits there)."""
        i = position + self._n
        self._push(i)
        return self._t[i]

    def set(self, position: int, room: int) -> None:
        """A job arrives at ``position`` with ``room`` (its key: nothing has passed it yet)."""
        if position >= self._n:
            self._grow(position)
        i = position + self._n
        self._push(i)
        self._t[i] = room
        self._build(i)

    def clear(self, position: int) -> None:
        """The job at ``position`` stops waiting: its room no longer binds."""
        self.set(position, NONE)

    def give_back(self, position: int, amount: int) -> None:
        """The job at ``position`` was passed by ``amount`` while it could not go (perjob.exempt_charges)."""
        room = self.room(position) if position < self._n else NONE
        if room < NONE // 2:
            self.set(position, room + amount)

    def lower(self, position: int, rate: int) -> None:
        """A job at ``position`` is admitted with ``rate``: every older waiting job was passed by it."""
        if position <= 0:
            return
        lo, hi = self._n, min(position, self._n) + self._n
        l0, h0 = lo, hi
        while lo < hi:
            if lo & 1:
                self._apply(lo, -rate)
                lo += 1
            if hi & 1:
                hi -= 1
                self._apply(hi, -rate)
            lo >>= 1
            hi >>= 1
        self._build(l0)
        self._build(h0 - 1)

    def least(self, lo: int, hi: int) -> int | None:
        """The least room of the waiting jobs with ``lo <= position < hi`` (None: none waits there)."""
        hi = min(hi, self._n)
        if lo >= hi:
            return None
        lo, hi = lo + self._n, hi + self._n
        self._push(lo)
        self._push(hi - 1)
        best = NONE
        t = self._t
        while lo < hi:
            if lo & 1:
                best = min(best, t[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = min(best, t[hi])
            lo >>= 1
            hi >>= 1
        return None if best >= NONE // 2 else best


class EpochRooms:
    """The same rooms as :class:`RoomTree`, kept as the ledger keeps them (lane_plugin.ledger.overtake): per epoch.

    Positions fall in epochs of ``epoch`` consecutive ones. Each epoch with a waiting job holds a counter
    ``passed``, each waiting job a ``base`` (its key when it arrived, plus its epoch's counter then: 0 here, where
    every job is numbered; in the ledger a job not numbered charges the newest epoch too), and its room is
    ``base - passed``. An admission at ``position`` passes every older waiting job: it adds its rate to the counter
    of each older epoch and takes it off the ``base`` of the older jobs of its own epoch (at most ``epoch - 1``
    rows). A read of the least room over a range of positions takes, per epoch the range covers whole, the least
    ``base`` (the head of an index on ``(epoch, base)`` over the waiting jobs) less the counter, and reads the
    jobs of the at most two epochs it covers in part one by one (at most ``2 x epoch`` rows). So the rooms are
    exactly the tree's (tests/sim/test_rooms.py checks it on random operations).

    What it costs is counted in :attr:`costs`. The epochs an admission writes are those the waiting jobs' positions
    span, not the waiting jobs over ``epoch``: one job held back per epoch keeps each alive. Rule 12 bounds that
    span in rate tokens (a job is passed by at most its key), not in jobs, so jobs much smaller than the one held
    back make it wide; on the two traces it stayed at most 40 epochs of 64 (docs/admission.md).

    Example (epochs of 2 positions):
        >>> r = EpochRooms(lambda jid: None, 2)
        >>> for p, room in enumerate((50, 900, 400)): r.set(p, room)
        >>> r.lower(2, 30); r.least(0, 2), r.least(2, 3), r.room(1)   # 0 and 1 were passed (a counter)
        (20, 400, 870)
        >>> r.clear(3); r.set(3, 80); r.lower(3, 10); r.least(2, 3), r.room(2)   # 3 passed 2 (its base)
        (390, 390)
        >>> r.clear(0); r.least(0, 2), r.least(0, 1)
        (860, None)
    """

    def __init__(self, position_of: Callable[[str], int | None], epoch: int) -> None:
        if epoch < 1:
            raise ValueError(f"epoch={epoch!r} must be >= 1 (positions per epoch)")
        self.position = position_of
        self.size = epoch
        self.passed: dict[int, int] = {}  # epoch -> its counter, while a job waits in it
        self.heads: dict[int, list[tuple[int, int]]] = {}  # epoch -> (base, position), lazily deleted
        self.waiting: dict[int, set[int]] = {}  # epoch -> its waiting positions
        self.base: dict[int, int] = {}  # waiting position -> base
        # What the ledger would read and write: per admission, counters and job rows written; per read of the
        # least room, heads and job rows read; the most epochs alive and jobs waiting at an admission.
        self.costs = dict.fromkeys(("admissions", "counters", "rows", "reads", "heads", "read_rows"), 0)
        self.costs.update(max_epochs=0, max_waiting=0)

    def room(self, position: int) -> int:
        """The room at ``position`` (:data:`NONE`: no job waits there)."""
        b = self.base.get(position)
        return NONE if b is None else b - self.passed[position // self.size]

    def _put(self, e: int, position: int, base: int) -> None:
        self.base[position] = base
        heappush(self.heads[e], (base, position))

    def set(self, position: int, room: int) -> None:
        """A job arrives at ``position`` with ``room`` (positions only grow, as arrivals are numbered)."""
        e = position // self.size
        if e not in self.passed:
            self.passed[e], self.heads[e], self.waiting[e] = 0, [], set()
        self.waiting[e].add(position)
        self._put(e, position, room + self.passed[e])

    def give_back(self, position: int, amount: int) -> None:
        """The job at ``position`` was passed by ``amount`` while it could not go (perjob.exempt_charges)."""
        if position in self.base:
            self._put(position // self.size, position, self.base[position] + amount)

    def clear(self, position: int) -> None:
        """The job at ``position`` stops waiting; an epoch with no job left waiting is dropped."""
        if self.base.pop(position, None) is None:
            return
        e = position // self.size
        self.waiting[e].discard(position)
        if not self.waiting[e]:
            del self.passed[e], self.heads[e], self.waiting[e]

    def lower(self, position: int, rate: int) -> None:
        """A job at ``position`` is admitted with ``rate``: every older waiting job was passed by it."""
        own, costs = position // self.size, self.costs
        costs["admissions"] += 1
        costs["max_epochs"] = max(costs["max_epochs"], len(self.passed))
        costs["max_waiting"] = max(costs["max_waiting"], len(self.base))
        for e in self.passed:
            if e < own:
                self.passed[e] += rate
                costs["counters"] += 1
        for q in self.waiting.get(own, ()):
            if q < position:
                self._put(own, q, self.base[q] - rate)
                costs["rows"] += 1

    def _head(self, e: int) -> int:
        heap = self.heads[e]
        while self.base.get(heap[0][1]) != heap[0][0]:
            heappop(heap)
        return heap[0][0]

    def least(self, lo: int, hi: int) -> int | None:
        """The least room of the waiting jobs with ``lo <= position < hi`` (None: none waits there)."""
        best: int | None = None
        self.costs["reads"] += 1
        for e, counter in self.passed.items():
            start, end = e * self.size, (e + 1) * self.size
            if end <= lo or start >= hi:
                continue
            if lo <= start and end <= hi:
                base: int | None = self._head(e)
                self.costs["heads"] += 1
            else:
                base = min((self.base[q] for q in self.waiting[e] if lo <= q < hi), default=None)
                self.costs["read_rows"] += len(self.waiting[e])
            if base is not None:
                best = base - counter if best is None else min(best, base - counter)
        return best


class TenantRooms:
    """Rooms kept per tenant (what :class:`lane_plugin.policy.perjob.Rooms` gives): one :class:`RoomTree` or
    :class:`EpochRooms` per tenant, positions the lane's arrival order; an admission lowers only its own tenant's.

    ``make``: a new tenant's structure, given ``position_of``; ``position_of``: a waiting job's position from its id;
    ``tenant_of``: its tenant.

    Example:
        >>> r = TenantRooms(lambda position_of: RoomTree(position_of), lambda jid: None, lambda jid: "a")
        >>> r.set("a", 0, 50); r.set("b", 1, 900); r.set("a", 2, 400)
        >>> r.lower("a", 2, 30); r.least(0, 3, "a"), r.least(0, 3, "b"), r.least_any(0, 3)   # b was not passed
        (20, 900, 20)
    """

    def __init__(
        self,
        make: Callable[[Callable[[str], int | None]], RoomTree | EpochRooms],
        position_of: Callable[[str], int | None],
        tenant_of: Callable[[str], str],
    ) -> None:
        self.make, self.position, self.tenant = make, position_of, tenant_of
        self.by: dict[str, RoomTree | EpochRooms] = {}

    def _of(self, tenant: str) -> RoomTree | EpochRooms:
        rooms = self.by.get(tenant)
        if rooms is None:
            rooms = self.by[tenant] = self.make(self.position)
        return rooms

    def set(self, tenant: str, position: int, room: int) -> None:
        """A job of ``tenant`` arrives at ``position`` with ``room``."""
        self._of(tenant).set(position, room)

    def clear(self, tenant: str, position: int) -> None:
        """The job of ``tenant`` at ``position`` stops waiting."""
        self._of(tenant).clear(position)

    def lower(self, tenant: str, position: int, rate: int) -> None:
        """A job of ``tenant`` at ``position`` is admitted with ``rate``: its tenant's older waiting jobs were passed."""
        self._of(tenant).lower(position, rate)

    def give_back(self, tenant: str, position: int, amount: int) -> None:
        """The job of ``tenant`` at ``position`` was passed by ``amount`` while it could not go."""
        self._of(tenant).give_back(position, amount)

    def least(self, lo: int, hi: int, tenant: str) -> int | None:
        """The least room of ``tenant``'s waiting jobs with ``lo <= position < hi``."""
        rooms = self.by.get(tenant)
        return None if rooms is None else rooms.least(lo, hi)

    def least_any(self, lo: int, hi: int) -> int | None:
        """The least room of any tenant's waiting jobs with ``lo <= position < hi``."""
        found = [r for r in (rooms.least(lo, hi) for rooms in self.by.values()) if r is not None]
        return min(found, default=None)

    def release(self) -> None:
        """Drop the callbacks (methods of the lane's queue): the run is freed by refcounting, not by a collector."""
        self.position = self.tenant = None  # type: ignore[assignment]
        for rooms in self.by.values():
            rooms.position = None  # type: ignore[assignment]

    @property
    def costs(self) -> dict[str, int]:
        """The epochs' costs summed over the tenants (:attr:`EpochRooms.costs`; empty for trees)."""
        total: dict[str, int] = {}
        for rooms in self.by.values():
            for k, v in getattr(rooms, "costs", {}).items():
                total[k] = max(total.get(k, 0), v) if k.startswith("max_") else total.get(k, 0) + v
        return total
