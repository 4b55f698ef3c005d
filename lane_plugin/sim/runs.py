"""The finishing reserve on a simulated clock, kept as the ledger keeps it.

The ledger keeps one ``lane_run`` row per run (its latest admitted stage, the
tokens it is expected to still need, when that reserve lapses) and the sum of
the reserves on the lane row; it refits the per-stage profile from the runs
that lapsed, at most every :data:`~lane_plugin.policy.REFIT_SECONDS`. A
:class:`RunBook` does the same for the simulator's ``lane`` policy with the
same pure functions (:func:`~lane_plugin.policy.fit_runs`), so the simulator
and the ledger reserve the same tokens at the same moments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any

from ..policy import FIT_RUNS, REFIT_SECONDS, Decision, LanePolicy, StageFit, fit_runs, reserve_hold, run_tokens

DONE = 3  # the engine's state code of a settled job


@dataclass
class Run:
    """A run with an admitted job: the ledger's ``lane_run`` row."""

    remaining: int = 0
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
        self._expiry: list[tuple[float, int, str]] = []
        self._lapsed: list[tuple[float, int, str]] = []  # the latest FIT_RUNS lapsed runs by last_at
        self._seq = 0
        self._active: set[str] = set()  # runs under way (expires_at set)
        self._dirty = True  # the fit's input changed since the last refit (else refitting changes nothing)
        self._fixed: dict[str, tuple[float, list]] = {}  # lapsed runs whose jobs all settled: their sequence

    def after(self, stage: str) -> int:
        """What a run is expected to still need after a job of ``stage`` (0 while unknown)."""
        fit = self.profile.get(stage)
        return fit.after if fit is not None else 0

    def lapse(self, now: float) -> None:
        """Runs whose reserve expired (no admission for their hold) are presumed finished."""
        heap = self._expiry
        while heap and heap[0][0] <= now:
            at, _, key = heappop(heap)
            run = self.runs[key]
            if run.expires_at != at:
                continue  # re-armed by a later admission
            self.finishing -= run.remaining
            run.remaining, run.expires_at = 0, None
            self._active.discard(key)
            self._seq += 1
            heappush(self._lapsed, (run.last_at, self._seq, key))
            if len(self._lapsed) > FIT_RUNS:
                heappop(self._lapsed)
            self._dirty = True

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
            if self.sim.admitted_at[j] < 0:  # its first admission (a lease that expired is admitted again)
                run.jobs.append(j)
        for key, remaining, stage in decision.runs:
            run = self.runs[key]
            run.remaining, run.stage, run.last_at = remaining, stage, now
            run.expires_at = now + reserve_hold(self.policy, self.profile.get(stage))
            self._active.add(key)
            self._seq += 1
            heappush(self._expiry, (run.expires_at, self._seq, key))
        self.finishing += decision.finishing
        return new

    def due(self, now: float) -> bool:
        return now - self.profile_at >= REFIT_SECONDS

    def refit(self, now: float) -> None:
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
        for key in self._active:
            run = self.runs[key]
            run.remaining = self.after(run.stage) if run.stage is not None else 0
            self.finishing += run.remaining
        self.version += 1

    def _sequence(self, key: str, run: Run) -> list:
        """A lapsed run's jobs as fit_runs reads them; kept once every job has settled (it cannot change)."""
        hit = self._fixed.get(key)
        if hit is not None and hit[0] == run.last_at:
            return hit[1]
        sim = self.sim
        est, actual, stage, arrival, state = sim.trace.est, sim.trace.actual, sim.trace.stage, sim.trace.arrival, sim.state
        jobs = sorted(run.jobs, key=lambda j: (sim.admitted_at[j], arrival[j], j))
        seq = [(stage[j], run_tokens(est[j], actual[j] if state[j] == DONE else 0), sim.admitted_at[j]) for j in jobs]
        if all(state[j] == DONE for j in jobs):
            self._fixed[key] = (run.last_at, seq)
        else:
            self._dirty = True  # a job still running may settle before the next refit
        return seq
