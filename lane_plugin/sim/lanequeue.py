"""The ``lane`` policy's waiting queue in the simulator: what the ledger's index and lane row hold.

:class:`LaneQueue` keeps the waiting jobs in the two ranges the store reads (finishing, other), in
``(prio, index)`` order, reads their head lazily for :func:`lane_plugin.sim.policies.select_lane`,
and learns what the ledger learns at a refit (the finishing reserve's profile, the size-class
boundary, the drift allowance). It also keeps the smallest estimates waiting by kind, so a tick that
cannot lease anything is known without reading the head (:meth:`LaneQueue.nothing_fits`).
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Iterator
from heapq import heappop, heappush
from typing import Any, Protocol

from ..policy import Candidate
from ..policy.drift import DRIFT_SAMPLE, drift_cap, fit_drift_arrays
from ..policy.fairness import DEFAULT_TENANT
from ..policy.order import priority
from ..policy.overtake import overtake_key
from ..policy.sizeclass import SIZE_CLASS_SAMPLE, size_class_boundary
from ..policy.slack import UNBOUNDED, BacklogQuantile, slack_key
from .rooms import EpochRooms, RoomTree, TenantRooms
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
    tenants: Any
    limits: Any
    held_by: str | None

    def candidate(self, j: int) -> Candidate: ...

    def units(self, j: int) -> dict[str, int]: ...

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
        import numpy as np  # here, not at the top: every `lane` command imports the simulator (to register it)

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
        self.dcap = drift_cap(self.policy.ceiling)
        self.other_est: dict[object, list[tuple[int, int]]] = {}
        # The overtaking budget (rule 12, SimConfig.overtake_beta; None: off), as the ledger keeps it: the rate
        # tokens waiting in the lane (what token-fifo serves before a job arriving now), the counter of
        # out-of-order rate tokens, and the waiting jobs by (key, arrival) and by arrival, lazily deleted
        # (an entry is stale once its job stops waiting or enters again with a new arrival number).
        self.beta = sim.cfg.overtake_beta
        self.slack = sim.cfg.overtake_slack  # rule 12's quantile form: keys from a running p99 of V (policy.slack)
        self.backlog = BacklogQuantile() if self.slack is not None else None
        # The p99 of V learned before the run (the ledger's refit, or its seed), read by every key; None: the
        # learning day's unbounded keys (SimConfig.overtake_day 1; engine.simulate learns it first for day 2), or
        # with overtake_day 0 the running estimate.
        self.learned = sim.cfg.overtake_learned
        self.running = sim.cfg.overtake_day == 0
        # The stages of runs under way the last tick admitted: rule 12 neither held them nor charges their passes.
        self.uncharged: frozenset[str] = frozenset()
        self.on = self.beta is not None or self.slack is not None
        # The learning day: every key unbounded, so no room or head can hold a pass back and the admissions are the
        # order's alone; the arrivals are numbered and their V kept (what Q is learned from), no rooms are kept.
        self.learning = self.backlog is not None and self.learned is None and not self.running
        self.binds = self.on and not self.learning
        self.by_due: list[tuple[int, int, int]] = []  # (left at arrival + key, arrival, job): the slack's second bound
        self.either = sim.cfg.overtake_either  # the guard's rows carry their dues (SimConfig.overtake_either)
        self.due: dict[int, int] = {}
        self.arrivals: list[tuple[int, int]] = []  # (V, the estimate its key read), per arrival: the bound's check
        self.arrived_at: list[float] = []  # when each arrival entered (a lane learns Q from its last day's)
        self.waiting_rate = 0
        self.left_rate = 0  # rate tokens that left the queue (leased or parked)
        self.pos: dict[int, int] = {}  # left_rate + waiting_rate at each job's arrival
        self.arrived = 0
        self.seq: dict[int, int] = {}
        self.by_key: list[tuple[int, int, int]] = []
        self.by_age: list[tuple[int, int]] = []
        # Rule 12's exact per-job form (SimConfig.overtake_exact, an exploration: lane_plugin.policy.perjob): each
        # waiting job's own room, key - what passed it, by arrival number (None: the index heads above).
        # Kept per tenant (a job is charged only for its own tenant's passes), as the ledger keeps them; the
        # one-queue baseline ignores tenants, so its rooms are the lane's.
        self.rooms: TenantRooms | None = None
        self.by_age_of: dict[str, list[tuple[int, int]]] = {}  # per tenant: the oldest waiting (the ledger's index)
        self._tenanted = sim.policy == "lane"
        if sim.cfg.overtake_exact and self.binds:
            epoch, n = sim.cfg.overtake_epoch, 2 * len(sim.est) + 16

            def make(position_of):
                return RoomTree(position_of, n) if epoch is None else EpochRooms(position_of, epoch)

            self.rooms = TenantRooms(make, self._position, self._tenant)

    def prio(self, j: int) -> float:
        """Job ``j``'s place, given once (at intake, by the boundary known then and whether its run is
        under way), as the ledger stores it."""
        p = self._prio.get(j)
        if p is None:
            key = self.sim.trace.run_key[j]
            p = self._prio[j] = priority(
                self.policy,
                self.sim.est[j],
                self.sim.waiting_since[j],
                self.size_boundary,
                key is not None and key in self.runs.runs,
            )
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
            self._settled_est, self._settled_actual = (
                self._settled_est.astype(object),
                self._settled_actual.astype(object),
            )
        self._settled_est[i], self._settled_actual[i] = est, actual
        self._settles += 1

    @property
    def settled(self) -> list[tuple[int, int]]:
        """The latest :data:`DRIFT_SAMPLE` settlements ``(est, actual)`` the allowance is learned from (in no order)."""
        n = min(self._settles, DRIFT_SAMPLE)
        return list(zip(self._settled_est[:n].tolist(), self._settled_actual[:n].tolist()))

    def left(self, j: int, leased: bool = False) -> None:
        """Job ``j`` stops waiting (``leased``, or parked): token-fifo's queue no longer holds its rate tokens."""
        if self.on:
            self.waiting_rate -= self.sim.rate[j]
            self.left_rate += self.sim.rate[j]
            if self.rooms is not None:
                tenant = self.tenant_of(j)
                self.rooms.clear(tenant, self.seq[j])
                if leased and self.sim.job_id(j) not in self.uncharged:  # it passed its tenant's older jobs waiting
                    self.rooms.lower(tenant, self.seq[j], self.sim.rate[j])

    def _position(self, job_id: str) -> int | None:
        """A waiting job's arrival number from its id (the rooms' position; None: not waiting)."""
        j = int(job_id[1:])
        return self.seq.get(j) if self.sim.state[j] == WAITING else None

    def tenant_of(self, j: int) -> str:
        """Whose rooms job ``j`` counts in: its tenant (the one-queue baseline: the lane's one)."""
        return (self.sim.trace.tenant[j] or DEFAULT_TENANT) if self._tenanted else DEFAULT_TENANT

    def _tenant(self, job_id: str) -> str:
        return self.tenant_of(int(job_id[1:]))

    def _first(self, heap: list, n: int) -> list:
        """The first ``n`` live entries of one of the budget's heaps, in order (they stay in it)."""
        state, seq = self.sim.state, self.seq
        while heap and (state[heap[0][-1]] != WAITING or seq.get(heap[0][-1]) != heap[0][-2]):
            heappop(heap)
        out = []
        while heap and len(out) < n:
            e = heappop(heap)
            if state[e[-1]] == WAITING and seq.get(e[-1]) == e[-2]:
                out.append(e)
        for e in out:
            heappush(heap, e)
        return out

    def guard(self, n: int) -> tuple[tuple[int, str], ...]:
        """The least ``n`` keys of the waiting jobs, ``(key, id)`` ascending (LaneSnapshot.guard)."""
        job_id = self.sim.job_id
        return tuple((k, job_id(j)) for k, _, j in self._first(self.by_key, n))

    def guard_dues(self, guard: tuple[tuple[int, str], ...]) -> tuple[int, ...]:
        """The due of each ``guard`` row, in its order (LaneSnapshot.guard_dues)."""
        return tuple(self.due[int(jid[1:])] for _, jid in guard)

    def dues(self, n: int) -> tuple[tuple[int, str], ...]:
        """The least ``n`` dues (left at arrival + key) of the waiting jobs, ``(due, id)`` ascending (LaneSnapshot.dues)."""
        job_id = self.sim.job_id
        return tuple((d, job_id(j)) for d, _, j in self._first(self.by_due, n))

    def passed(self, oldest: int) -> int:
        """The rate tokens younger than the oldest waiting job that left the queue since it arrived (at least
        what passed it): what left since, less the ``V`` that waited ahead of it, all gone now."""
        return self.left_rate - self.pos[oldest]

    def oldest(self, n: int) -> list[int]:
        """The ``n`` waiting jobs that entered the queue first, in that order."""
        return [j for _, j in self._first(self.by_age, n)]

    def oldest_held(self, n: int, burst: int) -> list[int]:
        """The ``n`` oldest waiting jobs of each tenant some of whose rooms are short of ``burst`` (the per-job
        rooms: a job its tenant's rooms hold back may pass only them; the ledger's per-tenant read of
        ix_job_tenant_arrival)."""
        assert self.rooms is not None
        out: list[int] = []
        for tenant, heap in self.by_age_of.items():
            if not heap:  # (a tenant with nothing waiting since its heap emptied: no read of its rooms)
                continue
            room = self.rooms.least(0, self.arrived + 1, tenant)
            if room is not None and room < burst:
                out += [j for _, j in self._first(heap, n)]
        return out

    def push(self, j: int) -> None:
        sim = self.sim
        p = self._prio.get(j)
        if p is None:  # a job entering the lane: its estimate is one the boundary learns from
            p = self.prio(j)
            self.recent.append(sim.est[j])
        if self.on:  # an arrival: its number and key (a job entering again is a new arrival)
            self.arrived += 1
            self.seq[j] = n = self.arrived
            self.pos[j] = self.left_rate + self.waiting_rate
            if self.backlog is not None:
                if self.learned is not None or self.running:
                    estimate = self.backlog.value() if self.learned is None else self.learned
                    key = slack_key(self.waiting_rate, estimate, self.slack)
                else:  # the learning day: numbered, its V kept, nobody held back
                    estimate, key = 0, UNBOUNDED
                self.backlog.add(self.waiting_rate)
                self.arrivals.append((self.waiting_rate, estimate))
                self.arrived_at.append(sim.waiting_since[j])
                if self.binds:
                    heappush(self.by_due, (self.left_rate + key, n, j))
                    self.due[j] = self.left_rate + key
            else:
                key = overtake_key(self.waiting_rate, self.beta)
            if self.rooms is not None:
                tenant = self.tenant_of(j)
                self.rooms.set(tenant, n, key)
                heappush(self.by_age_of.setdefault(tenant, []), (n, j))
            elif self.binds:  # the heads (an exploration)
                heappush(self.by_key, (key, n, j))
                heappush(self.by_age, (n, j))
            self.waiting_rate += sim.rate[j]
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
        dcap = self.dcap
        drifts = self.drift > 1.0 or self.overrun > 0 or self.spread > 0
        base = self.overrun + self.spread * (sim.leased + 1)
        extra = max(0, round(self.drift * 10_000) - 10_000)

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

        What the store's two-range read returns, sorted as :func:`~lane_plugin.policy.order.order`
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
                if (
                    state[j] == WAITING
                    and (i_o == 0 or other[i_o - 1] != e)
                    and (run_key[j] is None or run_key[j] not in runs)
                ):
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


def candidate_for(sim: Sim, j: int) -> Candidate:
    """The ``lane`` policy's view of waiting job ``j`` (its id sorts like its index)."""
    q, tr = sim.lane_queue, sim.trace
    units = sim.units(j) if sim.limits else None  # its input and output allowance, for the limits over them
    return Candidate(
        sim.job_id(j),
        sim.est[j],
        sim.waiting_since[j],
        tr.run_key[j],
        sim.rate[j],
        tr.stage[j],
        q.runs.after(tr.stage[j]) if tr.run_key[j] is not None else 0,
        q.prio(j),
        sim.var[j],
        tr.tenant[j] or DEFAULT_TENANT,
        units and units["input_tokens"],
        units and units["output_tokens"],
    )
