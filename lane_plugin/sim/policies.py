"""The admission policies ``lane simulate`` compares, as small functions.

Each function chooses which waiting jobs a simulated lane leases at ``now`` and
returns their indices in admission order. They read the engine's counters and
its ordered waiting structures (heaps with lazy deletion) and only ever look
at their head, so a tick costs the same with 10 or 100,000 jobs waiting.

- ``lane``: the ledger's own policy, :func:`lane_plugin.policy.admit`, called
  with the same kind of bounded head the store reads from its indexes.
- ``count``: up to K jobs leased at once, FIFO, blind to tokens (what tag or
  work-pool slot limits do).
- ``token-fifo``: arrival order, stops at the first job that does not fit the
  ceiling (``spent + reserved + est <= ceiling``): head-of-line blocking.
- ``smallest-first``: the article's ``tick`` with its bugs kept on purpose:
  budget is ``ceiling - spent`` (ignores leased estimates and never shrinks as
  it admits), burst counted per tick, no aging (big jobs can starve).
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any, Protocol

from ..policy import HEAD_SLACK, Candidate, LaneSnapshot, admit
from .runs import RunBook

WAITING = 0  # the engine's state code of a waiting job


class Sim(Protocol):
    """What a policy reads of the engine (:class:`lane_plugin.sim.engine.Sim`)."""

    cfg: Any
    state: bytearray
    est: list[int]
    waiting_since: list[float]
    age: list[int]
    by_est: list[tuple[int, int]]
    spent: int
    reserved: int
    leased: int
    rate: list[int]
    window: Any
    lane_queue: Any
    trace: Any

    def candidate(self, j: int) -> Candidate: ...

    def index_of(self, c: Candidate) -> int: ...

    def stopped(self, t: float) -> bool: ...

    def park(self, j: int, t: float) -> None: ...


def _valid_head(sim: Sim, heap: list, n: int, key, skip=None) -> list:
    """Pop up to ``n`` distinct waiting entries off ``heap`` (caller pushes back).

    With ``skip``, entries for which ``skip(entry)`` is true are stale (the job
    now sits in another heap) and are dropped like admitted ones.
    """
    state = sim.state
    out, seen = [], set()
    while heap and len(out) < n:
        entry = heap[0]
        j = key(entry)
        if state[j] != WAITING or j in seen or (skip is not None and skip(entry)):
            heappop(heap)  # lazy deletion: admitted, parked, moved or a duplicate entry
            continue
        heappop(heap)
        seen.add(j)
        out.append(entry)
    return out


class LaneQueue:
    """The ``lane`` policy's waiting jobs, as the ledger's index (lane, state, finishing, prio) holds them.

    Two heaps by priority: jobs of runs already under way (*finishing*) and the
    rest. A job moves to the first when its run starts; its entry in the second
    goes stale and is skipped.
    """

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.policy = sim.cfg.lane_policy
        self.runs = RunBook(sim, self.policy)
        self.other: list[tuple[float, int]] = []
        self.finishing: list[tuple[float, int]] = []
        self.members: dict[str, list[int]] = {}  # waiting jobs of runs not started yet
        self._prio: dict[int, float] = {}

    def prio(self, j: int) -> float:
        p = self._prio.get(j)
        if p is None:
            p = self._prio[j] = self.policy.priority(self.sim.est[j], self.sim.waiting_since[j])
        return p

    def push(self, j: int) -> None:
        key = self.sim.trace.run_key[j]
        if key is not None and key in self.runs.runs:
            heappush(self.finishing, (self.prio(j), j))
        else:
            heappush(self.other, (self.prio(j), j))
            if key is not None:
                self.members.setdefault(key, []).append(j)

    def started(self, keys: list[str]) -> None:
        for key in keys:
            for j in self.members.pop(key, ()):
                if self.sim.state[j] == WAITING:
                    heappush(self.finishing, (self.prio(j), j))

    def head(self, n: int) -> tuple[list, list]:
        runs, run_key = self.runs.runs, self.sim.trace.run_key
        fin = _valid_head(self.sim, self.finishing, n, lambda e: e[1])
        other = _valid_head(self.sim, self.other, n, lambda e: e[1],
                            skip=lambda e: run_key[e[1]] is not None and run_key[e[1]] in runs)  # fmt: skip
        return fin, other


def select_lane(sim: Sim, now: float) -> tuple[list[int], int | bool]:
    """The ledger's policy on the bounded head of its queue.

    Like the store's tick: the reserves of runs that went quiet lapse, then the
    ``free slots + 16`` first waiting jobs of each class (finishing, other) go
    to :func:`lane_plugin.policy.admit`; every ``REFIT_SECONDS`` the finishing
    reserve is refit from the runs that lapsed.

    Returns:
        Admitted job indices, and the rate tokens the window must make room for
        (0 if the burst window blocked nothing), so the engine ticks again when it has.
    """
    cfg, q = sim.cfg, sim.lane_queue
    book = q.runs
    book.lapse(now)
    head = max(cfg.max_leased - sim.leased, 0) + HEAD_SLACK
    fin, other = q.head(head)
    cands = [sim.candidate(e[1]) for e in fin + other]
    keys = {c.run_key for c in cands if c.run_key is not None}
    started = frozenset(k for k in keys if k in book.runs)
    snap = LaneSnapshot(
        policy=q.policy, spent=sim.spent, reserved=sim.reserved, leased=sim.leased,
        window_used=sim.window.used(now), now=now, stopped=sim.stopped(now), started_runs=started,
        finishing=book.finishing, run_remaining={k: book.runs[k].remaining for k in started},
        resets=bool(cfg.period_seconds),
    )  # fmt: skip
    decision = admit(snap, cands)
    admitted = [sim.index_of(c) for c in decision.admitted]
    q.started(book.record(decision, admitted, now))
    taken = set(admitted)
    for c, _, _ in decision.parked:
        j = sim.index_of(c)
        taken.add(j)
        sim.park(j, now)
    for heap, entries in ((q.finishing, fin), (q.other, other)):
        for e in entries:
            if e[1] not in taken:
                heappush(heap, e)
    if book.due(now):
        book.refit(now)
    return admitted, decision.burst_need or 0


def _peek(sim: Sim, heap: list) -> int | None:
    while heap and sim.state[heap[0]] != WAITING:
        heappop(heap)
    return heap[0] if heap else None


def select_count(sim: Sim, now: float) -> tuple[list[int], bool]:
    """Up to ``count_slots`` leased at once, oldest first, tokens ignored."""
    out = []
    leased = sim.leased
    while leased < sim.cfg.slots:
        j = _peek(sim, sim.age)
        if j is None:
            break
        heappop(sim.age)
        out.append(j)
        leased += 1
    return out, False


def select_token_fifo(sim: Sim, now: float) -> tuple[list[int], bool]:
    """Oldest first while ``spent + reserved + est <= ceiling``; stop at the first misfit."""
    cfg = sim.cfg
    out = []
    committed = sim.spent + sim.reserved
    leased = sim.leased
    while leased < cfg.max_leased:
        j = _peek(sim, sim.age)
        if j is None or committed + sim.est[j] > cfg.ceiling:
            break
        heappop(sim.age)
        out.append(j)
        committed += sim.est[j]
        leased += 1
    return out, False


def select_smallest_first(sim: Sim, now: float) -> tuple[list[int], bool]:
    """The article's ``tick``: smallest first, ``est <= ceiling - spent``, burst per tick.

    The seed scans every row and ``continue``s past misfits; estimates only grow
    along the scan and ``weight``/``budget`` never change on a misfit, so the
    first misfit ends the scan with the same result while reading only the head.
    """
    cfg = sim.cfg
    budget = cfg.ceiling - sim.spent  # the seed's bug: ignores reserved, never shrinks
    weight = 0
    leased = sim.leased
    out = []
    heap = sim.by_est
    while heap and leased < cfg.max_leased:
        est, j = heap[0]
        if sim.state[j] != WAITING:
            heappop(heap)
            continue
        if weight + est > cfg.burst_tokens or est > budget:
            break
        heappop(heap)
        out.append(j)
        weight += est
        leased += 1
    return out, False


POLICIES = {
    "count": select_count,
    "token-fifo": select_token_fifo,
    "smallest-first": select_smallest_first,
    "lane": select_lane,
}
USES_EST_HEAP = {"smallest-first"}


def candidate_for(sim: Sim, j: int) -> Candidate:
    """The ``lane`` policy's view of waiting job ``j`` (its id sorts like its index)."""
    q, tr = sim.lane_queue, sim.trace
    return Candidate(sim.job_id(j), sim.est[j], sim.waiting_since[j], tr.run_key[j], sim.rate[j], tr.stage[j],
                     q.runs.after(tr.stage[j]) if tr.run_key[j] is not None else 0, q.prio(j))  # fmt: skip
