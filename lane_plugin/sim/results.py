"""What one simulated policy did with one trace, and the order statistics used to say it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .traffic import Trace


@dataclass
class SimResult:
    """What one policy did with one trace."""

    policy: str
    jobs: int
    done: int
    spent: int
    over_ceiling: int
    over_allowance: int
    busy_pct: float
    wait_p50: float
    wait_p99: float
    big_wait_p50: float
    big_wait_p99: float
    starved: int
    parked: int
    expired: int
    waiting_at_end: int
    wall_seconds: float
    jobs_per_s: float
    peak_period_spent: int
    series_t: list[float] = field(default_factory=list, repr=False)
    series_spent: list[int] = field(default_factory=list, repr=False)
    waits: list[float | None] = field(default_factory=list, repr=False)
    log: list[tuple] = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        """The figures, without the per-job series (for ``--json``)."""
        skip = {"series_t", "series_spent", "waits", "log"}
        return {k: v for k, v in self.__dict__.items() if k not in skip}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (0 <= q <= 1); NaN when empty."""
    if not values:
        return math.nan
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def big_threshold(trace: Trace, refused: list[bool]) -> int:
    """Smallest estimate of the largest decile of (admissible) jobs."""
    ests = [e for e, r in zip(trace.est, refused) if not r]
    return percentile(ests, 0.9) if ests else 0


__all__ = ["SimResult", "big_threshold", "percentile"]
