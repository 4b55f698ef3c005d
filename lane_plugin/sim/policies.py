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
    window_used: int
    started: set[str]

    def candidate(self, j: int) -> Candidate: ...

    def index_of(self, c: Candidate) -> int: ...

    def stopped(self, t: float) -> bool: ...


def _valid_head(sim: Sim, heap: list, n: int, key, until=None) -> list:
    """Pop up to ``n`` distinct waiting entries off ``heap`` (caller pushes back).

    With ``until``, stop at the first waiting entry for which ``until(entry)``
    is false (the heap's order makes every later entry false too).
    """
    state = sim.state
    out, seen = [], set()
    while heap and len(out) < n:
        entry = heap[0]
        j = key(entry)
        if state[j] != WAITING or j in seen:
            heappop(heap)  # lazy deletion: admitted, parked or a duplicate entry
            continue
        if until is not None and not until(entry):
            break
        heappop(heap)
        seen.add(j)
        out.append(entry)
    return out


def select_lane(sim: Sim, now: float) -> tuple[list[int], bool]:
    """The ledger's policy on the bounded head of both orderings.

    Like the store's tick: the ``free slots + 16`` smallest waiting jobs and
    the ``free slots + 16`` oldest *due* ones, deduplicated.

    Returns:
        Admitted job indices, and whether the burst window blocked a job (so
        the engine ticks again when the window rolls over).
    """
    cfg = sim.cfg
    head = max(cfg.max_leased - sim.leased, 0) + HEAD_SLACK
    by_est = _valid_head(sim, sim.by_est, head, lambda e: e[1])
    cut = now - cfg.max_wait_seconds
    since = sim.waiting_since
    by_age = _valid_head(sim, sim.age, head, lambda e: e, lambda j: since[j] <= cut)
    picked = {e[1] for e in by_est}
    picked.update(by_age)
    cands = [sim.candidate(j) for j in picked]
    started = frozenset(c.run_key for c in cands if c.run_key is not None and c.run_key in sim.started)
    snap = LaneSnapshot(
        policy=cfg.lane_policy,
        spent=sim.spent,
        reserved=sim.reserved,
        leased=sim.leased,
        window_used=sim.window_used,
        now=now,
        stopped=sim.stopped(now),
        started_runs=started,
    )
    decision = admit(snap, cands)
    admitted = [sim.index_of(c) for c in decision.admitted]
    taken = set(admitted)
    for e in by_est:
        if e[1] not in taken:
            heappush(sim.by_est, e)
    for j in by_age:
        if j not in taken:
            heappush(sim.age, j)
    # Jobs left waiting while the window holds tokens may fit when it rolls over.
    blocked = sim.window_used + decision.tokens > 0 and len(admitted) < len(cands)
    return admitted, blocked


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
USES_EST_HEAP = {"lane", "smallest-first"}


def candidate_for(sim: Sim, j: int) -> Candidate:
    """The policy's view of waiting job ``j`` (its id sorts like its index)."""
    return Candidate(sim.job_id(j), sim.est[j], sim.waiting_since[j], sim.trace.run_key[j])
