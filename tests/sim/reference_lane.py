"""The ``lane`` policy's admission path as it was before it was made fast (main at 6b2873b).

Kept verbatim as the reference the fast path must match: ``reference_admit`` sorted every head and
scanned all of it; ``select_lane_reference`` popped the two ranges' heads and pushed them back at
every tick; ``refit_reference`` refit the finishing reserve from every lapsed run anew.
tests/sim/test_fast_path.py runs both on seeded traffic and compares every tick. (Since then the
RunBook no longer stores each run's reserve: the reference reads it as ``book.remaining(key)``, what
the profile gives the run's latest stage, which is what it stored; and LaneQueue's ranges became
sorted lists read in place: ``push_reference`` and ``started_reference`` keep them heaps, as they were.)
"""

from __future__ import annotations

from collections.abc import Iterable
from heapq import heappop, heappush
from typing import Any

from lane_plugin.policy import Candidate, Decision, LaneSnapshot
from lane_plugin.policy.admission import HEAD_SLACK
from lane_plugin.policy.candidate import FINISH, FREE, START, kind_of
from lane_plugin.policy.drift import capped, fit_drift, over_charge
from lane_plugin.policy.order import order
from lane_plugin.policy.reserve import fit_runs
from lane_plugin.policy.rules import BURST, LEASE_CAP, STOPPED, blocking_rule, unfit_before_reset
from lane_plugin.policy.sizeclass import size_class_boundary

WAITING = 0
Sim = Any


def reference_admit(snapshot: LaneSnapshot, candidates: Iterable[Candidate]) -> Decision:
    """Choose which candidates to lease now.

    Args:
        snapshot: the lane's counters and policy inside the admission transaction.
        candidates: the head of the waiting queue (any order; ids unique).

    Returns:
        The admitted candidates in admission order and what they add to the
        lane's counters, the head holding a shadow reservation (if any), the
        rule that blocked the first job not admitted, and the jobs to park.

    Example:
        >>> p = LanePolicy(ceiling=1000, burst_tokens=500, max_leased=2)
        >>> s = LaneSnapshot(p, spent=0, reserved=0, leased=0, window_used=0, now=0.0)
        >>> admit(s, [Candidate("a", 300, 0.0), Candidate("b", 100, 0.0)]).ids
        ['b', 'a']
    """
    p = snapshot.policy
    if snapshot.stopped:
        return Decision((), 0, head_reason=STOPPED)
    committed, finishing = snapshot.spent + snapshot.reserved, snapshot.finishing
    leased, window, var = snapshot.leased, snapshot.window_used, snapshot.reserved_var
    started, remaining = set(snapshot.started_runs), dict(snapshot.run_remaining)
    runs: dict[str, tuple[int, str | None]] = {}
    admitted: list[Candidate] = []
    parked: list[tuple[Candidate, str, str]] = []
    tokens = rate = 0
    shadow: Candidate | None = None
    sh_kind, sh_est, sh_extra, sh_rate, sh_slot, sh_var = FREE, 0, 0, 0, 0, 0
    head_reason: str | None = None
    burst_need: int | None = None

    left, burst, start_left = p.ceiling - snapshot.spent, p.burst_tokens, p.start_limit - snapshot.spent
    # Changed since 6b2873b on purpose (issue 11, "never past the ceiling"): the drift allowance of
    # rule 3, the same change as policy.admit's (what is in flight charged at its drift-corrected size).
    # And the cap on it (found by an outside review): at most 5% of the ceiling and what the ceiling leaves the job
    # (drift.capped; blocking_rule caps the in-flight allowance it is given).
    drift, overrun, spread = snapshot.drift, snapshot.overrun, snapshot.spread
    for c in order(snapshot, candidates):
        kind = kind_of(c, started)
        need = c.est + (c.after if kind == START else 0)
        unfit = None
        if (
            need
            + (p.headroom(c.var) if c.var else 0)
            + capped(over_charge(drift, overrun, spread, c.est, 1), p.ceiling, c.est)
            > left
            or c.rate > burst
            or (kind == START and c.est > start_left)
        ):  # (a fast test first)
            unfit = unfit_before_reset(
                p, c, kind, spent=snapshot.spent, need=need, drift=drift, overrun=overrun, spread=spread
            )
        if unfit is not None:  # it holds no shadow and blocks nobody
            if head_reason is None:
                head_reason = unfit[0]
            if not snapshot.resets:
                parked.append((c, *unfit))
            continue
        held = shadow is not None and (sh_kind == FINISH or kind != FINISH)
        rule = blocking_rule(
            p,
            est=c.est,
            kind=kind,
            rate_cost=c.rate,
            need=need,
            committed=committed + (sh_est if held else 0),
            finishing=finishing + (sh_extra if held else 0),
            leased=leased + sh_slot,
            window_used=window + sh_rate,
            var=var + c.var + (sh_var if held else 0),
            over=over_charge(
                drift,
                overrun,
                spread,
                committed + (sh_est if held else 0) - snapshot.spent + c.est,
                leased + (1 if held else 0) + 1,
            ),
        )
        if rule is None:
            admitted.append(c)
            tokens, rate, committed, leased, window = (
                tokens + c.est,
                rate + c.rate,
                committed + c.est,
                leased + 1,
                window + c.rate,
            )
            var += c.var
            if kind != FREE:
                finishing += c.after - remaining.get(c.run_key, 0)
                remaining[c.run_key] = c.after
                runs[c.run_key] = (c.after, c.stage)
                started.add(c.run_key)
            continue
        if head_reason is None:
            head_reason = rule
        if rule == BURST:
            room = c.rate + sh_rate
            burst_need = room if burst_need is None else min(burst_need, room)
        if shadow is None and rule != LEASE_CAP:
            shadow, sh_kind, sh_est, sh_rate, sh_slot, sh_var = c, kind, c.est, c.rate, 1, c.var
            sh_extra = need - c.est if kind != FINISH else 0
    return Decision(
        tuple(admitted),
        tokens,
        shadow,
        head_reason,
        rate,
        finishing - snapshot.finishing,
        tuple((k, r, s) for k, (r, s) in runs.items()),
        tuple(parked),
        burst_need,
        var - snapshot.reserved_var,
    )


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


def select_lane_reference(sim: Sim, now: float) -> tuple[list[int], int | bool]:
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
    runs, run_key = q.runs.runs, sim.trace.run_key
    fin = _valid_head(sim, q.finishing, head, lambda e: e[1])
    other = _valid_head(
        sim, q.other, head, lambda e: e[1], skip=lambda e: run_key[e[1]] is not None and run_key[e[1]] in runs
    )
    cands = [sim.candidate(e[1]) for e in fin + other]
    keys = {c.run_key for c in cands if c.run_key is not None}
    started = frozenset(k for k in keys if k in book.runs)
    snap = LaneSnapshot(
        policy=q.policy,
        spent=sim.spent,
        reserved=sim.reserved,
        leased=sim.leased,
        window_used=sim.window.used(now),
        now=now,
        stopped=sim.stopped(now),
        started_runs=started,
        finishing=book.finishing,
        run_remaining={k: book.remaining(k) for k in started},
        resets=bool(cfg.period_seconds),
        reserved_var=sim.reserved_var,
        drift=q.drift,
        overrun=q.overrun,
        spread=q.spread,
    )
    decision = reference_admit(snap, cands)
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
        # Changed since 6b2873b on purpose (issue 11, the `learned60` lean): the refit also learns
        # the size-class boundary new jobs are placed by (LaneQueue.prio); while it is None, as before.
        q.size_boundary = size_class_boundary(q.recent)
        q.drift, q.overrun, q.spread = fit_drift(q.settled)  # and the drift allowance (issue 11, the same change)
    return admitted, decision.burst_need or 0


def push_reference(self, j: int) -> None:
    """LaneQueue.push when its two ranges were heaps (popped and pushed back at every tick)."""
    if j not in self._prio:  # a job entering the lane: its estimate is one the boundary learns from
        self.prio(j)
        self.recent.append(self.sim.est[j])
    heappush(self.biggest, (-self.sim.est[j], j))
    self.max_var = max(self.max_var, self.sim.var[j])
    key = self.sim.trace.run_key[j]
    if key is not None and key in self.runs.runs:
        heappush(self.finishing, (self.prio(j), j))
    else:
        heappush(self.other, (self.prio(j), j))
        if key is not None:
            self.members.setdefault(key, []).append(j)


def started_reference(self, keys: list[str]) -> None:
    """LaneQueue.started when its two ranges were heaps."""
    for key in keys:
        for j in self.members.pop(key, ()):
            if self.sim.state[j] == WAITING:
                heappush(self.finishing, (self.prio(j), j))


def refit_reference(self, now: float) -> None:
    """Learn the profile from the lapsed runs, then re-reserve the runs under way with it.

    Skipped (the same result) when no run lapsed or came back and every job of the
    runs it learns from had settled at the last refit.
    """
    self.lapse(now)
    self.profile_at = now
    if not self._dirty:
        return
    self._dirty = False
    sequences = []
    for last_at, _, key in self._lapsed:
        run = self.runs[key]
        if run.expires_at is not None or run.last_at != last_at:
            continue  # revived by a later job
        sequences.append(self._sequence(key, run))
    self.profile.update(fit_runs(sequences))
    self.finishing = 0
    for key, run in self.runs.items():  # the runs under way (expires_at set)
        if run.expires_at is None:
            continue
        self.finishing += self.remaining(key)
    self.version += 1
