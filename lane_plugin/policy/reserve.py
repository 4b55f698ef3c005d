"""The finishing reserve: what runs under way are expected to still need, learned from finished runs.

Pure functions (no database, no clock), used by admission (:mod:`lane_plugin.policy.admission`:
a starting job leaves room for the reserve of every run under way), the ledger's profile refit
(:mod:`lane_plugin.ledger.runs`) and the simulator. The refit also relearns the drift allowance
(:mod:`lane_plugin.policy.drift`) and the size-class boundary (:mod:`lane_plugin.policy.sizeclass`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .lane import LanePolicy

# The finishing reserve is refit from finished runs at most this often, from the latest FIT_RUNS.
REFIT_SECONDS = 300.0
FIT_RUNS = 500


@dataclass(frozen=True)
class StageFit:
    """What runs did after a job of one stage: the tokens of their later jobs, the gap to the next."""

    after: int
    hold: float
    runs: int


def run_tokens(est: int, actual: int) -> int:
    """What one job of a finished run counts for the reserve: admission needed ``est``, the bill was ``actual``."""
    return max(est, actual)


def fit_runs(runs: Iterable[Sequence[tuple[str, int, float]]]) -> dict[str, StageFit]:
    """Learn, per stage, what a run still needs after a job of that stage.

    Args:
        runs: finished runs, each its admitted jobs in admission order as
            ``(stage, tokens, admitted_at)`` (tokens: :func:`run_tokens`).

    Returns:
        For every stage seen: ``after``, the mean tokens of the jobs that
        followed it in its run (drift-corrected: it counts what they really took),
        and ``hold``, twice the 95th percentile of the time to the run's next
        admission (0 if no job ever followed), how long a run's reserve is kept
        before it is presumed abandoned.

    Example:
        >>> fit = fit_runs([[("draft", 100, 0.0), ("final", 300, 10.0)], [("draft", 120, 0.0), ("final", 500, 20.0)]])
        >>> fit["draft"].after, fit["draft"].hold, fit["final"].after
        (400, 40.0, 0)
    """
    after: dict[str, int] = {}  # per stage: the tokens its runs took after it, summed
    seen: dict[str, int] = {}  # per stage: how many jobs of it
    gaps: dict[str, list[float]] = {}  # per stage: the seconds to its run's next admission
    for run in runs:
        jobs = list(run)
        tail = sum(t for _, t, _ in jobs)
        for i, (stage, tokens, at) in enumerate(jobs):
            tail -= tokens
            after[stage] = after.get(stage, 0) + tail
            seen[stage] = seen.get(stage, 0) + 1
            stage_gaps = gaps.setdefault(stage, [])
            if i + 1 < len(jobs):
                stage_gaps.append(max(0.0, jobs[i + 1][2] - at))
    out = {}
    for stage, total in after.items():
        n, waits = seen[stage], sorted(gaps[stage])
        gap = waits[min(len(waits) - 1, math.ceil(0.95 * len(waits)) - 1)] if waits else 0.0
        out[stage] = StageFit(after=math.ceil(total / n), hold=2.0 * gap, runs=n)
    return out


def reserve_hold(policy: LanePolicy, fit: StageFit | None) -> float:
    """Seconds a run keeps its reserve after its latest admission (at least one lease)."""
    return max(policy.lease_seconds, fit.hold if fit is not None else 0.0)
