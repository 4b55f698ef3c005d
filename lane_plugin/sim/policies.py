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
from dataclasses import replace
from heapq import heappop

from ..policy import LaneSnapshot, admit
from ..policy.admission import HEAD_SLACK
from ..policy.drift import capped, over_charge
from ..policy.limits import TOKENS
from ..policy.reserve import REFIT_SECONDS
from ..policy.rules import BURST, LIMIT_PREFIX
from .lanequeue import WAITING, LaneQueue, Sim


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
    # Skip reading the head when admit would lease and park nothing. Asked first (the common case, and
    # cheap): does some waiting job (the smallest or the biggest the engine keeps) pass rules 3 and 4 at
    # the most they could charge it?
    some = _smallest(sim) if cfg.period_seconds else -q.biggest[0][0] if q.biggest else math.inf
    if (
        resets
        and sim.spent + sim.reserved + book.finishing + some + book.most_after() + q.dcap > q.policy.ceiling
        and q.nothing_fits()
    ):
        if now - book.profile_at >= REFIT_SECONDS:
            q.refit(now)
        return [], 0
    snap = LaneSnapshot(
        policy=q.policy,
        spent=sim.spent,
        reserved=sim.reserved,
        leased=sim.leased,
        window_used=sim.window.used(now),
        now=now,
        stopped=sim.stopped(now),
        started_runs=book.runs,
        finishing=book.finishing,
        run_remaining=book,  # type: ignore[arg-type]
        resets=resets,
        reserved_var=sim.reserved_var,
        drift=q.drift,
        overrun=q.overrun,
        spread=q.spread,
        limits=sim.limits.uses(now) if sim.limits else (),
        rooms=q.rooms,  # rule 12's exact per-job form (None: off, or its learning day)
    )
    k = max(cfg.max_leased - sim.leased, 0) + HEAD_SLACK
    # The overtaking budget (rule 12): the least keys waiting and the oldest jobs, as the store reads two index
    # heads. While the budget has more room than the window could admit this tick it cannot bind: the oldest
    # need not be read as candidates (the snapshot still names them, so one read in the head goes in order).
    late: list = []
    if q.rooms is not None:  # the exact per-job form: each job's own room, no heads (policy.perjob)
        late = [q.candidate(j) for j in q.oldest_held(k, q.policy.burst_tokens)]
    elif q.binds:  # (on the learning day no key binds: the order alone)
        guard = q.guard(k + 2)
        oldest = q.oldest(k)
        passed = q.passed(oldest[0]) if oldest else 0
        snap = replace(snap, passed=passed, guard=guard, oldest=tuple(sim.job_id(j) for j in oldest))
        room = guard[0][0] - passed if guard else 0
        if q.slack is not None:  # the slack's second bound: what left the queue since each job arrived
            dues = q.dues(k + 2)
            snap = replace(snap, since=q.left_rate, dues=dues)
            if q.either:
                snap = replace(snap, guard_dues=q.guard_dues(guard))
            room = max(room, dues[0][0] - q.left_rate) if dues else room
        if guard and room < q.policy.burst_tokens:
            late = [q.candidate(j) for j in oldest]
    # Several tenants: the head of each one's queue, merged fairly by admit.
    if sim.tenants is not None and sim.policy == "lane":
        tenants = sim.tenants
        decision = admit(replace(snap, tenants=tenants.states()), late + _tenant_heads(sim, q, k, seen))
    elif late:
        decision = admit(snap, late + list(q.head(k, seen)))
    else:
        decision = admit(snap, q.head(k, seen), ordered=True)
    q.uncharged = decision.uncharged
    if decision.admitted or decision.parked:
        admitted = [int(c.id[1:]) for c in decision.admitted]  # sim.index_of
        parked = [sim.index_of(c) for c, _, _ in decision.parked]
        q.drop(seen, set(admitted).union(parked))
        if q.rooms is not None:  # passed while held (its tenant's budget, the period): not counted against it
            for job_id, amount in decision.exempt:
                position = q.rooms.position(job_id)
                if position is not None:
                    q.rooms.give_back(q.rooms.tenant(job_id), position, amount)
        q.started(book.record(decision, admitted, now))
        for j in parked:
            sim.park(j, now)
    else:  # nothing leased or parked: record() would change nothing
        admitted = []
        if seen:
            q.drop(seen, ())
    if now - book.profile_at >= REFIT_SECONDS:  # book.due(now)
        q.refit(now)
    for unit, need in decision.limit_need:  # a limit kept a job out: tick again when its window has room
        sim.limits.kept_out(now, unit, need)
    reason = decision.head_reason
    if reason == BURST:
        sim.held_by = TOKENS
    elif reason is not None and reason.startswith(LIMIT_PREFIX):
        sim.held_by = reason[len(LIMIT_PREFIX) :]
    return admitted, decision.burst_need or 0


# Several tenants: the head of each backlogged tenant's queue, ``k`` jobs (or all it has waiting), as the store
# reads ix_job_tenant_queue tenant by tenant. The lane's merged head is read first, at most this many times
# ``k`` entries (it also drops the stale entries there); a tenant it is short of is read from its own queue.
TENANT_SCAN = 4


def _tenant_heads(sim: Sim, q: LaneQueue, k: int, seen: list) -> list:
    book = sim.tenants
    want = {t: min(k, n) for t, n in book.waiting.items() if n > 0}
    got: dict[str, list] = {t: [] for t in want}
    left = len(want)
    for i, c in enumerate(q.head(k * TENANT_SCAN, seen)):
        mine = got.get(c.tenant)
        if mine is not None and len(mine) < want[c.tenant]:
            mine.append(c)
            left -= len(mine) == want[c.tenant]
            if not left:
                break
        if i + 1 >= k * TENANT_SCAN:
            break
    out = []
    for t, mine in got.items():
        if len(mine) < want[t]:  # deeper than the merged head read: the tenant's own queue
            mine = [q.candidate(j) for j in book.head(t, want[t], WAITING, sim.state)]
        out += mine
    return out


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


def _kept_out(sim: Sim, now: float, j: int, added: dict[str, int]) -> bool:
    """Whether one of the lane's limits keeps job ``j`` out, given the units this tick admitted (``added``).

    A job kept out names the limit (``sim.held_by``) and has the engine tick again when its window has room.
    """
    limits = sim.limits
    if not limits:
        return False
    units = sim.units(j)
    unit = limits.blocking(now, units, added)
    if unit is None:
        for k, n in units.items():
            added[k] = added.get(k, 0) + n
        return False
    sim.held_by = unit
    limits.kept_out(now, unit, units[unit] + added.get(unit, 0))
    return True


def _fifo(sim: Sim, now: float, cap: int, ceiling: float) -> tuple[list[int], int]:
    """Oldest first within ``cap`` leases, ``ceiling``, the window and the limits; stop at the first misfit."""
    out: list[int] = []
    committed = sim.spent + sim.reserved
    leased = sim.leased
    room = _room(sim, now)
    est, rate = sim.est, sim.rate
    added: dict[str, int] = {}
    while leased < cap:
        j = _peek(sim, sim.age)
        if j is None or committed + est[j] > ceiling:
            return out, 0
        if rate[j] > room:
            sim.held_by = TOKENS
            return out, rate[j]
        if _kept_out(sim, now, j, added):
            return out, 0
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
    out: list[int] = []
    heap = sim.by_est
    added: dict[str, int] = {}
    while heap and leased < cfg.max_leased:
        est, j = heap[0]
        if sim.state[j] != WAITING:
            heappop(heap)
            continue
        if est > budget:
            return out, 0
        if rate[j] > room:
            sim.held_by = TOKENS
            return out, rate[j]
        if _kept_out(sim, now, j, added):
            return out, 0
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
# With several tenants in the trace, ``lane simulate`` adds today's order as a baseline beside ``lane``: the
# ledger's policy with the tenants ignored (one queue, first come by priority: what a lane did before tenants).
ONE_QUEUE = "lane-one-queue"
LANE_POLICIES = {"lane", ONE_QUEUE}
EXTRA_POLICIES = {ONE_QUEUE: select_lane}


def policy_named(name: str):
    """The select function of ``name`` (read at each call: tests may patch :data:`POLICIES`), or None."""
    return POLICIES.get(name) or EXTRA_POLICIES.get(name)


USES_EST_HEAP = {"smallest-first", "lane", ONE_QUEUE}
