"""The admission policies ``lane simulate`` compares, as small functions.

Each function chooses which waiting jobs a simulated lane leases at ``now`` and
returns their indices in admission order, and the rate tokens of a job the
burst window kept out (0: none; the engine ticks again when the window has
that much room). They read
the engine's counters and its ordered waiting structures (heaps with lazy
deletion) and only ever look at their head, so a tick costs the same with 10
or 100,000 jobs waiting.

Every policy obeys the same limits: its lease cap (``max_leased``; ``count``'s
K defaults to it) and the burst window, which the engine keeps
(``sim.window``: ``rate_cost`` admitted in the last ``window_seconds``,
sliding). The baselines check it themselves; ``lane`` runs the ledger's rule
on it.

- ``lane``: the ledger's own policy, :func:`lane_plugin.policy.admit`, called
  with the same kind of bounded head the store reads from its index, the
  engine's window and the ledger's finishing-reserve bookkeeping (``RunBook``).
- ``count``: up to K jobs leased at once, FIFO, blind to the budget (what tag or
  work-pool slot limits do), within the burst window.
- ``token-fifo``: arrival order, stops at the first job that does not fit the
  ceiling (``spent + reserved + est <= ceiling``) or the window: head-of-line
  blocking.
- ``smallest-first``: the article's ``tick`` with its budget bug kept on
  purpose: budget is ``ceiling - spent`` (ignores leased estimates and never
  shrinks as it admits), no aging (big jobs can starve). Its per-tick burst is
  replaced by the shared window.
"""

from __future__ import annotations

import math
from bisect import insort
from collections import deque
from collections.abc import Iterator
from heapq import heappop, heappush
from typing import Any, Protocol

import numpy as np

from ..policy import (
    DRIFT_SAMPLE,
    HEAD_SLACK,
    REFIT_SECONDS,
    SIZE_CLASS_SAMPLE,
    Candidate,
    LaneSnapshot,
    admit,
    capped,
    drift_cap,
    fit_drift_arrays,
    over_charge,
    size_class_boundary,
)
from .runs import RunBook

WAITING = 0  # the engine's state code of a waiting job
FREE = object()  # LaneQueue.other_est's key for jobs without a run


class Sim(Protocol):
    """What a policy reads of the engine (:class:`lane_plugin.sim.engine.Sim`)."""

    cfg: Any
    state: bytearray
    est: list[int]
    waiting_since: list[float]
    age: list[tuple[float, int]]
    by_est: list[tuple[int, int]]
    spent: int
    reserved: int
    reserved_var: int
    var: list[int]
    leased: int
    rate: list[int]
    window: Any
    lane_queue: Any
    trace: Any

    def candidate(self, j: int) -> Candidate: ...

    def index_of(self, c: Candidate) -> int: ...

    def stopped(self, t: float) -> bool: ...

    def park(self, j: int, t: float) -> None: ...


class LaneQueue:
    """The ``lane`` policy's waiting jobs, as the ledger's index (lane, state, finishing, prio) holds them.

    Two ranges, lists sorted by ``(prio, index)``: jobs of runs already under way
    (*finishing*) and the rest. A job moves to the first when its run starts; its
    entry in the second goes stale. Admission reads the ranges in place, so the
    head it leaves is not moved; stale entries are deleted when a read passes them.
    """

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.policy = sim.cfg.lane_policy
        self.runs = RunBook(sim, self.policy)
        self.other: list[tuple[float, int]] = []
        self.finishing: list[tuple[float, int]] = []
        self.members: dict[str, list[int]] = {}  # waiting jobs of runs not started yet
        self.biggest: list[tuple[int, int]] = []  # waiting jobs by (-est, index): read without a period
        self._biggest = not sim.cfg.period_seconds
        self.max_var = 0  # the largest est_var any job had (headroom grows with it)
        self._prio: dict[int, float] = {}
        self._cands: dict[int, Candidate] = {}  # candidates built under the profile of version _cands_at
        self._cands_at = self.runs.version
        # The size classes, learned as the ledger learns them: the boundary of the last
        # SIZE_CLASS_SAMPLE estimates submitted, refit with the profile (None: not yet).
        self.recent: deque[int] = deque(maxlen=SIZE_CLASS_SAMPLE)
        self.size_boundary: int | None = None
        # The drift allowance, learned as the ledger learns it: from the last DRIFT_SAMPLE
        # settlements (est, actual), refit with the profile (1.0, 0 and 0: none yet).
        # (a ring: the fit does not depend on their order; int64, or Python integers past it)
        self._settled_est = np.zeros(DRIFT_SAMPLE, dtype=np.int64)
        self._settled_actual = np.zeros(DRIFT_SAMPLE, dtype=np.int64)
        self.drift, self.overrun, self.spread = 1.0, 0, 0
        self._settles = self._fitted = 0  # settlements seen, and seen at the last fit (none since: the same fit)
        # The smallest estimates waiting, by what a job needs besides its estimate: every job that ever
        # entered the finishing range (a job's run, once started, stays started), and the other range's
        # jobs per stage (FREE: no run, nothing after it), each (est, index) with lazy deletion.
        self.fin_est: list[tuple[int, int]] = []
        self.other_est: dict[object, list[tuple[int, int]]] = {}

    def prio(self, j: int) -> float:
        """Job ``j``'s place, given once (at intake, by the boundary known then and whether its run is
        under way), as the ledger stores it."""
        p = self._prio.get(j)
        if p is None:
            key = self.sim.trace.run_key[j]
            p = self._prio[j] = self.policy.priority(self.sim.est[j], self.sim.waiting_since[j], self.size_boundary,
                                                     key is not None and key in self.runs.runs)  # fmt: skip
        return p

    def refit(self, now: float) -> None:
        """What the ledger's refit does: the finishing reserve's profile, the size-class boundary and
        the drift allowance."""
        self.runs.refit(now)
        self.size_boundary = size_class_boundary(self.recent)
        if self._settles != self._fitted:
            n = min(self._settles, DRIFT_SAMPLE)
            self.drift, self.overrun, self.spread = fit_drift_arrays(self._settled_est[:n], self._settled_actual[:n])
            self._fitted = self._settles

    def settle(self, est: int, actual: int) -> None:
        """A settlement the drift allowance learns from (the ledger's settlement rows)."""
        i = self._settles % DRIFT_SAMPLE
        if max(abs(est), abs(actual)) >= 2**62 and self._settled_est.dtype != object:
            self._settled_est, self._settled_actual = self._settled_est.astype(object), self._settled_actual.astype(object)
        self._settled_est[i], self._settled_actual[i] = est, actual
        self._settles += 1

    @property
    def settled(self) -> list[tuple[int, int]]:
        """The latest :data:`DRIFT_SAMPLE` settlements ``(est, actual)`` the allowance is learned from (in no order)."""
        n = min(self._settles, DRIFT_SAMPLE)
        return list(zip(self._settled_est[:n].tolist(), self._settled_actual[:n].tolist()))

    def push(self, j: int) -> None:
        sim = self.sim
        p = self._prio.get(j)
        if p is None:  # a job entering the lane: its estimate is one the boundary learns from
            p = self.prio(j)
            self.recent.append(sim.est[j])
        if self._biggest:
            heappush(self.biggest, (-sim.est[j], j))
        if sim.var[j] > self.max_var:
            self.max_var = sim.var[j]
        key = sim.trace.run_key[j]
        if key is not None and key in self.runs.runs:
            insort(self.finishing, (p, j))
            heappush(self.fin_est, (sim.est[j], j))
        else:
            insort(self.other, (p, j))
            heap = self.other_est.get(FREE if key is None else sim.trace.stage[j])
            if heap is None:
                heap = self.other_est[FREE if key is None else sim.trace.stage[j]] = []
            heappush(heap, (sim.est[j], j))
            if key is not None:
                self.members.setdefault(key, []).append(j)

    def started(self, keys: list[str]) -> None:
        for key in keys:
            for j in self.members.pop(key, ()):
                if self.sim.state[j] == WAITING:
                    insort(self.finishing, (self.prio(j), j))
                    heappush(self.fin_est, (self.sim.est[j], j))

    def nothing_fits(self) -> bool:
        """Whether :func:`~lane_plugin.policy.admit` is sure to lease nothing now, read off the smallest estimates.

        Rule 3 with the drift allowance it charges the first candidate (the least any candidate is
        charged: a shadow only adds to it), for the smallest finishing job, and rule 4 for the smallest
        starting or free job of each stage. ``est`` plus its capped allowance grows with ``est``
        (``min(est + over, est + 5% of the ceiling, ceiling)``), so when the smallest of a kind fails,
        every job of that kind does; headroom, the start limit and the window only keep out more.
        For a lane that parks nothing (the caller's ``resets``): then admit decides nothing else.
        """
        sim, runs, run_key, state = self.sim, self.runs, self.sim.trace.run_key, self.sim.state
        ceiling = self.policy.ceiling
        committed = sim.spent + sim.reserved
        drifts = self.drift > 1.0 or self.overrun > 0 or self.spread > 0
        base = self.overrun + self.spread * (sim.leased + 1)
        extra = max(0, round(self.drift * 10_000) - 10_000)
        dcap = drift_cap(ceiling)

        def least(e: int) -> int:  # est and the allowance admit charges it first (rules._rule's cap)
            over = base - (-extra * (sim.reserved + e) // 10_000) if drifts else 0
            return e + (min(over, dcap, ceiling - e) if over else 0)

        heap = self.fin_est
        while heap and state[heap[0][1]] != WAITING:
            heappop(heap)
        if heap and committed + least(heap[0][0]) <= ceiling:
            return False
        committed += runs.finishing
        started = runs.runs
        for stage, heap in self.other_est.items():
            while heap and (state[heap[0][1]] != WAITING or (stage is not FREE and run_key[heap[0][1]] in started)):
                heappop(heap)  # admitted, parked, or its run started: the finishing heap holds it now
            if heap and committed + least(heap[0][0]) + (0 if stage is FREE else runs.after(stage)) <= ceiling:
                return False
        return True

    def candidate(self, j: int) -> Candidate:
        """Job ``j``'s candidate, cached until the reserve profile is refit (its ``after`` reads the profile)."""
        if self._cands_at != self.runs.version:
            self._cands.clear()
            self._cands_at = self.runs.version
        c = self._cands.get(j)
        if c is None:
            c = self._cands[j] = candidate_for(self.sim, j)
        return c

    def head(self, n: int, seen: list) -> Iterator[Candidate]:
        """The first ``n`` waiting jobs of each range, merged in admission order, read lazily.

        What the store's two-range read returns, sorted as :func:`~lane_plugin.policy.order`
        sorts it (``(prio, id)``; ids sort like indices), read in place only as far as admission
        reads. Every entry scanned is appended to ``seen`` as ``(range, index, job)``, job -1 for a
        stale one (admitted, parked, a duplicate, or moved to the finishing range); the caller
        then deletes those and the ones it takes (:meth:`drop`), before anything is inserted.
        """
        sim, runs, run_key = self.sim, self.runs.runs, self.sim.trace.run_key
        state = sim.state
        if self._cands_at != self.runs.version:  # no refit happens while admission reads the head
            self._cands.clear()
            self._cands_at = self.runs.version
        cands = self._cands
        fin, other = self.finishing, self.other
        n_f, n_o = len(fin), len(other)
        # A job's entries carry its one cached priority, so its duplicates sit next to each other.
        i_f = i_o = 0
        left_f = left_o = n
        while True:
            f = o = None
            while left_f and i_f < n_f:
                e = fin[i_f]
                if state[e[1]] == WAITING and (i_f == 0 or fin[i_f - 1] != e):
                    f = e
                    break
                seen.append((fin, i_f, -1))
                i_f += 1
            while left_o and i_o < n_o:
                e = other[i_o]
                j = e[1]
                if (state[j] == WAITING and (i_o == 0 or other[i_o - 1] != e)
                        and (run_key[j] is None or run_key[j] not in runs)):  # fmt: skip
                    o = e
                    break
                seen.append((other, i_o, -1))
                i_o += 1
            if f is not None and (o is None or f < o):
                seen.append((fin, i_f, f[1]))
                e, i_f, left_f = f, i_f + 1, left_f - 1
            elif o is not None:
                seen.append((other, i_o, o[1]))
                e, i_o, left_o = o, i_o + 1, left_o - 1
            else:
                return
            c = cands.get(e[1])
            if c is None:
                c = cands[e[1]] = candidate_for(sim, e[1])
            yield c

    def drop(self, seen: list, taken: set[int] | list[int]) -> None:
        """Remove the stale entries :meth:`head` scanned, and those of the jobs ``taken``, from the ranges."""
        for lst in (self.finishing, self.other):
            for r, i, j in reversed(seen):  # indices ascend within a range: delete from the back
                if r is lst and (j < 0 or j in taken):
                    del lst[i]


def select_lane(sim: Sim, now: float) -> tuple[list[int], int | bool]:
    """The ledger's policy on the bounded head of its queue.

    Like the store's tick: the reserves of runs that went quiet lapse, then the
    ``free slots + 16`` first waiting jobs of each class (finishing, other) go
    to :func:`lane_plugin.policy.admit`, in order and read no further than it
    needs; every ``REFIT_SECONDS`` the finishing reserve is refit from the runs
    that lapsed, and the size-class boundary from the latest estimates. (tests/sim/test_fast_path.py: the same admissions as reading
    and sorting the whole head.)

    Returns:
        Admitted job indices, and the rate tokens the window must make room for
        (0 if the burst window blocked nothing), so the engine ticks again when it has.
    """
    cfg, q = sim.cfg, sim.lane_queue
    book = q.runs
    if book._expiry and book._expiry[0][0] <= now:
        book.lapse(now)
    if cfg.period_seconds and _smallest_need(sim, q) > cfg.ceiling - sim.spent:
        # Every waiting job's estimate, with its capped drift allowance (which grows with the estimate),
        # exceeds what spend leaves until the reset: each candidate is unfit before the reset, so
        # admit would lease nothing and, the lane having a period, park nothing.
        if now - book.profile_at >= REFIT_SECONDS:
            q.refit(now)
        return [], 0
    seen: list[tuple[list, int, int]] = []
    # A lane without a period parks what cannot fit before a reset; when no waiting job is that
    # big, admission decides as in a lane with one, which may stop reading once it is closed.
    resets = bool(cfg.period_seconds) or _none_unfit(sim, q)
    if resets and q.nothing_fits():  # admit would lease nothing and park nothing: skip reading the head
        if now - book.profile_at >= REFIT_SECONDS:
            q.refit(now)
        return [], 0
    snap = LaneSnapshot(
        policy=q.policy, spent=sim.spent, reserved=sim.reserved, leased=sim.leased,
        window_used=sim.window.used(now), now=now, stopped=sim.stopped(now), started_runs=book.runs,
        finishing=book.finishing, run_remaining=book,  # type: ignore[arg-type]
        resets=resets, reserved_var=sim.reserved_var, drift=q.drift, overrun=q.overrun, spread=q.spread,
    )  # fmt: skip
    decision = admit(snap, q.head(max(cfg.max_leased - sim.leased, 0) + HEAD_SLACK, seen), ordered=True)
    if decision.admitted or decision.parked:
        admitted = [int(c.id[1:]) for c in decision.admitted]  # sim.index_of
        parked = [sim.index_of(c) for c, _, _ in decision.parked]
        q.drop(seen, set(admitted).union(parked))
        q.started(book.record(decision, admitted, now))
        for j in parked:
            sim.park(j, now)
    else:  # nothing leased or parked: record() would change nothing
        admitted = []
        if seen:
            q.drop(seen, ())
    if now - book.profile_at >= REFIT_SECONDS:  # book.due(now)
        q.refit(now)
    return admitted, decision.burst_need or 0


def _none_unfit(sim: Sim, q: LaneQueue) -> bool:
    """Whether no waiting job could be unfit before a reset (``policy.unfit_before_reset``).

    Every rate cost fits the burst (the rest were refused at intake); the biggest estimate, plus the
    most any run is expected to still need, the headroom of the largest spread any job had and the
    biggest estimate's drift allowance, fits what spend leaves, and the biggest estimate the start limit.
    (An estimate plus its capped allowance, ``min(est + over, est + 5% of the ceiling, ceiling)``, grows
    with the estimate: the biggest bounds every waiting job's.)
    """
    heap, state = q.biggest, sim.state
    while heap and state[heap[0][1]] != WAITING:
        heappop(heap)
    if not heap:
        return True
    big = -heap[0][0]
    after = q.runs.most_after()
    ceiling = q.policy.ceiling
    own = q.policy.headroom(q.max_var) + capped(over_charge(q.drift, q.overrun, q.spread, big, 1), ceiling, big)
    return big + after + own <= q.policy.ceiling - sim.spent and sim.spent + big <= q.policy.start_limit


def _smallest_need(sim: Sim, q: LaneQueue) -> float:
    """The smallest estimate of a waiting job with its capped drift allowance, inf if none.

    Both grow with the estimate (``est + capped(...)`` is ``min(est + over, est + 5% of the ceiling, ceiling)``).
    """
    small = _smallest(sim)
    if small == math.inf:
        return small
    est = int(small)
    return small + capped(over_charge(q.drift, q.overrun, q.spread, est, 1), q.policy.ceiling, est)


def _smallest(sim: Sim) -> float:
    """The smallest estimate of a waiting job (dropping stale entries), inf if none."""
    heap, state = sim.by_est, sim.state
    while heap and state[heap[0][1]] != WAITING:
        heappop(heap)
    return heap[0][0] if heap else math.inf


def _peek(sim: Sim, heap: list) -> int | None:
    """The oldest waiting job (dropping stale heap entries), or None."""
    state = sim.state
    while heap and state[heap[0][1]] != WAITING:
        heappop(heap)
    return heap[0][1] if heap else None


def _room(sim: Sim, now: float) -> float:
    """Rate tokens the burst window still takes at ``now`` (no window: no limit)."""
    cfg = sim.cfg
    return cfg.burst_tokens - sim.window.used(now) if cfg.window_seconds > 0 else math.inf


def _fifo(sim: Sim, now: float, cap: int, ceiling: float) -> tuple[list[int], int]:
    """Oldest first within ``cap`` leases, ``ceiling`` and the window; stop at the first misfit."""
    out = []
    committed = sim.spent + sim.reserved
    leased = sim.leased
    room = _room(sim, now)
    est, rate = sim.est, sim.rate
    while leased < cap:
        j = _peek(sim, sim.age)
        if j is None or committed + est[j] > ceiling:
            return out, 0
        if rate[j] > room:
            return out, rate[j]
        heappop(sim.age)
        out.append(j)
        committed += est[j]
        room -= rate[j]
        leased += 1
    return out, 0


def select_count(sim: Sim, now: float) -> tuple[list[int], int]:
    """Up to ``count_slots`` leased at once, oldest first, the budget ignored, within the window."""
    return _fifo(sim, now, sim.cfg.slots, math.inf)


def select_token_fifo(sim: Sim, now: float) -> tuple[list[int], int]:
    """Oldest first while ``spent + reserved + est <= ceiling`` and the window has room; stop at the first misfit."""
    return _fifo(sim, now, sim.cfg.max_leased, sim.cfg.ceiling)


def select_smallest_first(sim: Sim, now: float) -> tuple[list[int], int]:
    """The article's ``tick``: smallest first, ``est <= ceiling - spent``, within the window.

    The seed scans every row and ``continue``s past misfits; estimates only grow
    along the scan and its budget never changes on a misfit, so the first misfit
    ends the scan with the same result while reading only the head. (A window
    misfit ends it too: a later, bigger job may carry a smaller ``rate_cost``,
    but the seed had no such thing.)
    """
    cfg = sim.cfg
    budget = cfg.ceiling - sim.spent  # the seed's bug: ignores reserved, never shrinks
    room = _room(sim, now)
    rate = sim.rate
    leased = sim.leased
    out = []
    heap = sim.by_est
    while heap and leased < cfg.max_leased:
        est, j = heap[0]
        if sim.state[j] != WAITING:
            heappop(heap)
            continue
        if est > budget:
            return out, 0
        if rate[j] > room:
            return out, rate[j]
        heappop(heap)
        out.append(j)
        room -= rate[j]
        leased += 1
    return out, 0


POLICIES = {
    "count": select_count,
    "token-fifo": select_token_fifo,
    "smallest-first": select_smallest_first,
    "lane": select_lane,
}
USES_EST_HEAP = {"smallest-first", "lane"}


def candidate_for(sim: Sim, j: int) -> Candidate:
    """The ``lane`` policy's view of waiting job ``j`` (its id sorts like its index)."""
    q, tr = sim.lane_queue, sim.trace
    return Candidate(sim.job_id(j), sim.est[j], sim.waiting_since[j], tr.run_key[j], sim.rate[j], tr.stage[j],
                     q.runs.after(tr.stage[j]) if tr.run_key[j] is not None else 0, q.prio(j), sim.var[j])  # fmt: skip
