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
            self._seq += 1
            heappush(self._lapsed, (run.last_at, self._seq, key))
            if len(self._lapsed) > FIT_RUNS:
                heappop(self._lapsed)

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
            run.jobs.append(j)
        for key, remaining, stage in decision.runs:
            run = self.runs[key]
            run.remaining, run.stage, run.last_at = remaining, stage, now
            run.expires_at = now + reserve_hold(self.policy, self.profile.get(stage))
            self._seq += 1
            heappush(self._expiry, (run.expires_at, self._seq, key))
        self.finishing += decision.finishing
        return new

    def due(self, now: float) -> bool:
        return now - self.profile_at >= REFIT_SECONDS

    def refit(self, now: float) -> None:
        """Learn the profile from the lapsed runs, then re-reserve the runs under way with it."""
        self.lapse(now)
        sim = self.sim
        est, actual, stage, arrival = sim.trace.est, sim.trace.actual, sim.trace.stage, sim.trace.arrival
        sequences = []
        for last_at, _, key in self._lapsed:
            run = self.runs[key]
            if run.expires_at is not None or run.last_at != last_at:
                continue  # revived by a later job
            jobs = sorted(run.jobs, key=lambda j: (sim.admitted_at[j], arrival[j], j))
            sequences.append([(stage[j], run_tokens(est[j], actual[j] if sim.state[j] == DONE else 0),
                               sim.admitted_at[j]) for j in jobs])  # fmt: skip
        self.profile.update(fit_runs(sequences))
        self.finishing = 0
        for run in self.runs.values():
            if run.expires_at is not None:
                run.remaining = self.after(run.stage) if run.stage is not None else 0
                self.finishing += run.remaining
        self.profile_at = now
        self.version += 1
