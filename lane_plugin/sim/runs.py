"""The finishing reserve on a simulated clock, kept as the ledger keeps it.

The ledger keeps one ``lane_run`` row per run (its latest admitted stage, the
tokens it is expected to still need, when that reserve lapses) and the sum of
the reserves on the lane row; it refits the per-stage profile from the runs
that lapsed, at most every :data:`~lane_plugin.policy.reserve.REFIT_SECONDS`. A
:class:`RunBook` does the same for the simulator's ``lane`` policy with the
same pure functions (:func:`~lane_plugin.policy.reserve.fit_runs`), so the simulator
and the ledger reserve the same tokens at the same moments.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any

from ..policy import Decision, LanePolicy
from ..policy.reserve import FIT_RUNS, REFIT_SECONDS, StageFit, reserve_hold, run_tokens

DONE, PARKED = 3, 4  # the engine's state codes of a settled job and a parked one (neither ever changes)


@dataclass
class Run:
    """A run with an admitted job: the ledger's ``lane_run`` row (its reserve: :meth:`RunBook.remaining`)."""

    stage: str | None = None
    last_at: float = 0.0
    expires_at: float | None = None
    jobs: list[int] = field(default_factory=list)


class RunBook:
    """Runs under way, their reserves and the learned profile, for one simulated lane.

    Args:
        sim: the engine (reads ``trace``, ``state``, ``admitted_at``).
        policy: the lane's policy (``lease_seconds`` bounds how long a reserve is held).
    """

    def __init__(self, sim: Any, policy: LanePolicy) -> None:
        self.sim, self.policy = sim, policy
        self.runs: dict[str, Run] = {}
        self.finishing = 0
        self.profile: dict[str, StageFit] = {}
        self.version = 0  # bumped at every refit (cached candidates carry the profile's numbers)
        self.profile_at = -float("inf")
        self._most, self._most_at = 0, self.version
        self._expiry: list[tuple[float, int, str]] = []
        self._lapsed: list[tuple[float, int, str]] = []  # the latest FIT_RUNS lapsed runs by last_at
        self._seq = 0
        self._by_stage: dict[str | None, set[str]] = {}  # runs under way by their latest stage
        self._dirty = True  # the fit's input changed since the last refit (else refitting changes nothing)
        self._fixed: dict[str, tuple[float, list]] = {}  # lapsed runs whose jobs all settled: their sequence
        # The incremental fit: entries of _lapsed per (run, last_at), the sequence each run counts
        # with, per-stage [tail tokens, jobs, sorted gaps], and the runs to look at again.
        self._count: dict[tuple[str, float], int] = {}
        self._counted: dict[str, list] = {}
        self._sums: dict[str, list] = {}
        self._touched: set[str] = set()

    def after(self, stage: str | None) -> int:
        """What a run is expected to still need after a job of ``stage`` (0 while unknown)."""
        fit = self.profile.get(stage)
        return fit.after if fit is not None else 0

    def remaining(self, key: str) -> int:
        """The reserve run ``key`` holds: what the profile gives its latest stage while it is under way, else 0.

        Every run under way reserves exactly that (admission reserves the candidate's ``after``, read
        from the profile, and a refit re-reserves every run with the new profile), so it is read off
        the profile rather than stored per run, and a refit moves ``finishing`` by stage, not by run.
        """
        run = self.runs.get(key)
        return 0 if run is None or run.expires_at is None else self.after(run.stage)

    def most_after(self) -> int:
        """The most any run is expected to still need after a job of any stage (0 while unknown)."""
        if self._most_at != self.version:
            self._most = max((f.after for f in self.profile.values()), default=0)
            self._most_at = self.version
        return self._most

    def get(self, key: str, default: int = 0) -> int:
        """The reserve of run ``key`` (``default`` if the book holds no such run), read as
        ``LaneSnapshot.run_remaining`` reads it."""
        run = self.runs.get(key)
        if run is None:
            return default
        fit = None if run.expires_at is None else self.profile.get(run.stage)  # remaining(key), one call less
        return 0 if fit is None else fit.after

    def lapse(self, now: float) -> None:
        """Runs whose reserve expired (no admission for their hold) are presumed finished."""
        heap = self._expiry
        while heap and heap[0][0] <= now:
            at, _, key = heappop(heap)
            run = self.runs[key]
            if run.expires_at != at:
                continue  # re-armed by a later admission
            self.finishing -= self.remaining(key)
            run.expires_at = None
            self._by_stage[run.stage].discard(key)
            self._seq += 1
            heappush(self._lapsed, (run.last_at, self._seq, key))
            self._enter(key, run.last_at, 1)
            if len(self._lapsed) > FIT_RUNS:
                gone_at, _, gone = heappop(self._lapsed)
                self._enter(gone, gone_at, -1)
            self._dirty = True

    def _enter(self, key: str, last_at: float, n: int) -> None:
        """A lapsed run enters (1) or leaves (-1) the latest FIT_RUNS: the next refit looks at it again."""
        self._count[(key, last_at)] = self._count.get((key, last_at), 0) + n
        self._touched.add(key)

    def record(self, decision: Decision, admitted: list[int], now: float) -> list[str]:
        """Apply a tick's admissions; returns the runs that started in it."""
        trace, new = self.sim.trace, []
        for j in admitted:
            key = trace.run_key[j]
            if key is None:
                continue
            run = self.runs.get(key)
            if run is None:
                run = self.runs[key] = Run()
                new.append(key)
            elif run.expires_at is None:
                self._dirty = True  # a lapsed run came back: it leaves the fit's input
                self._touched.add(key)
            if self.sim.admitted_at[j] < 0:  # its first admission (a lease that expired is admitted again)
                run.jobs.append(j)
        for key, _, stage in decision.runs:  # each reserves the profile's after(stage): remaining()
            run = self.runs[key]
            if run.expires_at is not None:
                self._by_stage[run.stage].discard(key)
            run.stage, run.last_at = stage, now
            run.expires_at = now + reserve_hold(self.policy, self.profile.get(stage))
            self._by_stage.setdefault(stage, set()).add(key)
            self._seq += 1
            heappush(self._expiry, (run.expires_at, self._seq, key))
        self.finishing += decision.finishing
        return new

    def due(self, now: float) -> bool:
        return now - self.profile_at >= REFIT_SECONDS

    def refit(self, now: float) -> None:
        """Learn the profile from the lapsed runs, then re-reserve the runs under way with it.

        Incremental: the per-stage sums :func:`~lane_plugin.policy.reserve.fit_runs` makes are kept, and
        only the runs that lapsed, left the latest FIT_RUNS, came back or still had a job running
        are taken out and put back in, so the profile is the one ``fit_runs`` gives over every
        lapsed run (tests/sim/test_fast_path.py). Skipped when nothing it learns from changed.
        """
        self.lapse(now)
        self.profile_at = now
        if not self._dirty:
            return
        self._dirty = False
        touched, self._touched = self._touched, set()
        for key in touched:
            run = self.runs[key]
            seq = None
            if run.expires_at is None and self._count.get((key, run.last_at), 0) > 0:
                seq = self._sequence(key, run)
            old = self._counted.get(key)
            if old is not None and old != seq:
                self._add(old, -1)
                del self._counted[key]
            if seq is not None and old != seq:
                self._add(seq, 1)
                self._counted[key] = seq
        fit = {
            stage: StageFit(math.ceil(total / n), 2.0 * _p95(gaps), n)
            for stage, (total, n, gaps) in self._sums.items()
            if n
        }
        changed = [stage for stage, f in fit.items() if self.profile.get(stage) != f]
        if not changed:
            return  # the same profile: every run under way already reserves what it gives (admission set it)
        # Re-reserve the runs under way with the new profile: each holds after(its stage), so the
        # lane's finishing reserve moves by (new - old) x the runs at each stage whose fit changed.
        by_stage = self._by_stage
        for stage in changed:
            keys = by_stage.get(stage)
            if keys:
                self.finishing += (fit[stage].after - self.after(stage)) * len(keys)
        self.profile.update(fit)
        self.version += 1

    def _add(self, seq: list, sign: int) -> None:
        """Count one run's jobs in (sign 1) or out of (-1) the per-stage sums, as fit_runs counts them."""
        tail = sum(t for _, t, _ in seq)
        for i, (stage, tokens, at) in enumerate(seq):
            tail -= tokens
            acc = self._sums.get(stage)
            if acc is None:
                acc = self._sums[stage] = [0, 0, []]
            acc[0] += sign * tail
            acc[1] += sign
            if i + 1 < len(seq):
                gap = max(0.0, seq[i + 1][2] - at)
                if sign > 0:
                    insort(acc[2], gap)
                else:
                    del acc[2][bisect_left(acc[2], gap)]

    def _sequence(self, key: str, run: Run) -> list:
        """A lapsed run's jobs as fit_runs reads them; kept once every job has settled or been parked (final)."""
        hit = self._fixed.get(key)
        if hit is not None and hit[0] == run.last_at:
            return hit[1]
        sim = self.sim
        est, actual, stage, arrival, state = (
            sim.trace.est,
            sim.trace.actual,
            sim.trace.stage,
            sim.trace.arrival,
            sim.state,
        )
        jobs = sorted(run.jobs, key=lambda j: (sim.admitted_at[j], arrival[j], j))
        seq = [(stage[j], run_tokens(est[j], actual[j] if state[j] == DONE else 0), sim.admitted_at[j]) for j in jobs]
        if all(state[j] == DONE or state[j] == PARKED for j in jobs):
            self._fixed[key] = (run.last_at, seq)
        else:
            self._dirty = True  # a job still running may settle before the next refit
            self._touched.add(key)
        return seq


def _p95(gaps: list[float]) -> float:
    """fit_runs' 95th percentile of sorted gaps (0 if none)."""
    return gaps[min(len(gaps) - 1, math.ceil(0.95 * len(gaps)) - 1)] if gaps else 0.0
