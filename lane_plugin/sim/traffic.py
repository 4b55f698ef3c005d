"""Traffic for ``lane simulate``: a trace CSV, a generator, or a ledger's history.

Every source yields the same thing, a :class:`Trace`: jobs sorted by arrival
time (seconds from the start of the trace), each with its stage, the estimate
the lane admits on, the tokens it really costs, and the run it belongs to.
No pandas here: the CLI must start fast and a trace is a few flat lists.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TraceError

MIXES = ("lognormal", "bimodal", "uniform")
STAGE_NAMES = ("draft", "refine", "summarize", "review", "publish")


@dataclass
class Trace:
    """Jobs in arrival order. Parallel lists, one entry per job."""

    arrival: list[float] = field(default_factory=list)
    stage: list[str] = field(default_factory=list)
    est: list[int] = field(default_factory=list)
    actual: list[int] = field(default_factory=list)
    run_key: list[str | None] = field(default_factory=list)
    rate_cost: list[int | None] = field(default_factory=list)  # None: the estimate (the ledger's default)
    source: str = ""

    def __len__(self) -> int:
        return len(self.arrival)

    def add(self, arrival: float, stage: str, est: int, actual: int, run_key: str | None = None,
            rate_cost: int | None = None) -> None:  # fmt: skip
        """Append one job (call :meth:`sort` afterwards if arrivals are unordered)."""
        self.arrival.append(float(arrival))
        self.stage.append(stage)
        self.est.append(int(est))
        self.actual.append(int(actual))
        self.run_key.append(run_key)
        self.rate_cost.append(None if rate_cost is None else int(rate_cost))

    def sort(self) -> Trace:
        """Order jobs by arrival time (stable: ties keep their input order)."""
        idx = sorted(range(len(self)), key=self.arrival.__getitem__)
        if idx != list(range(len(self))):
            self.arrival = [self.arrival[i] for i in idx]
            self.stage = [self.stage[i] for i in idx]
            self.est = [self.est[i] for i in idx]
            self.actual = [self.actual[i] for i in idx]
            self.run_key = [self.run_key[i] for i in idx]
            self.rate_cost = [self.rate_cost[i] for i in idx]
        return self

    @property
    def span(self) -> float:
        """Seconds from the first to the last arrival."""
        return self.arrival[-1] - self.arrival[0] if self.arrival else 0.0


def _number(row: dict, name: str, line: int, kind=float):
    raw = (row.get(name) or "").strip()
    try:
        value = kind(float(raw)) if kind is int else kind(raw)
    except ValueError:
        raise TraceError(f"line {line}: {name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"line {line}: {name}={raw!r} must be a finite number >= 0")
    return value


def load_csv(path: str | Path) -> Trace:
    """Read a trace CSV with header ``arrival_s,stage,est,actual[,run_key]``.

    Args:
        path: the CSV file. ``run_key`` may be missing or empty (no run).

    Raises:
        TraceError: a missing column or a bad value, naming the line and field.
    """
    trace = Trace(source=f"trace {path}")
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        cols = [c.strip() for c in (reader.fieldnames or [])]
        reader.fieldnames = cols
        missing = [c for c in ("arrival_s", "stage", "est", "actual") if c not in cols]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)} (have: {', '.join(cols) or 'none'})")
        for line, row in enumerate(reader, start=2):
            est = _number(row, "est", line, int)
            if est <= 0:
                raise TraceError(f"line {line}: est={row['est']!r} must be > 0")
            trace.add(
                _number(row, "arrival_s", line),
                (row.get("stage") or "").strip() or "default",
                est,
                _number(row, "actual", line, int),
                (row.get("run_key") or "").strip() or None,
            )
    if not len(trace):
        raise TraceError(f"{path}: no jobs in the trace")
    return trace.sort()


def write_csv(trace: Trace, path: str | Path) -> None:
    """Write a trace in the format :func:`load_csv` reads."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arrival_s", "stage", "est", "actual", "run_key"])
        for i in range(len(trace)):
            w.writerow([f"{trace.arrival[i]:.3f}", trace.stage[i], trace.est[i], trace.actual[i], trace.run_key[i] or ""])


def _draw_est(rng: random.Random, mix: str, median: float) -> float:
    if mix == "lognormal":  # heavy tail: a few jobs cost 10-30x the median
        return median * rng.lognormvariate(0.0, 1.0)
    if mix == "bimodal":  # 80% small, 20% ten times bigger
        base = median * 0.6 if rng.random() < 0.8 else median * 6.0
        return base * rng.lognormvariate(0.0, 0.25)
    if mix == "uniform":  # the article's soak: RANDOM % 9000 + 500, scaled to the median
        return median / 5000.0 * rng.uniform(500, 9500)
    raise TraceError(f"mix={mix!r} is not one of {', '.join(MIXES)}")


def generate(
    jobs: int,
    *,
    mix: str = "lognormal",
    drift: float = 1.0,
    noise: float = 0.2,
    seed: int = 0,
    days: float = 7.0,
    stages: int = 3,
    stage_gap: float = 30.0,
    median: float = 1000.0,
    max_est: int | None = None,
) -> Trace:
    """Generate pipeline traffic: Poisson runs of ``stages`` jobs each.

    Args:
        jobs: total jobs (the last run may have fewer stages).
        mix: estimate distribution, one of ``MIXES``.
        drift: actual/estimate ratio of the estimator (1.3 = under-estimates by 30%).
        noise: sigma of the mean-1 lognormal noise on each actual.
        seed: random seed; the same seed gives the same trace.
        days: the trace spans this many days.
        stages: jobs per run (stage k of a run arrives ``k * stage_gap`` after stage 1).
        stage_gap: seconds between stages of one run.
        median: median estimate in tokens.
        max_est: clip estimates to this (e.g. the lane's burst), or None.
    """
    if jobs <= 0:
        raise TraceError(f"jobs={jobs} must be > 0")
    if mix not in MIXES:
        raise TraceError(f"mix={mix!r} is not one of {', '.join(MIXES)}")
    if drift <= 0:
        raise TraceError(f"drift={drift} must be > 0")
    if days <= 0:
        raise TraceError(f"days={days} must be > 0")
    if stages < 1:
        raise TraceError(f"stages={stages} must be >= 1")
    rng = random.Random(seed)
    runs = math.ceil(jobs / stages)
    mean_gap = days * 86_400.0 / runs
    mu = -noise * noise / 2.0  # mean-1 lognormal
    trace = Trace(source=f"generated: {jobs} jobs, {mix}, drift {drift}, seed {seed}, {days:g} days")
    t = 0.0
    made = 0
    for r in range(runs):
        t += rng.expovariate(1.0 / mean_gap) if r else 0.0
        for k in range(min(stages, jobs - made)):
            est = max(1, int(round(_draw_est(rng, mix, median))))
            if max_est is not None:
                est = min(est, max_est)
            actual = max(0, int(round(est * drift * rng.lognormvariate(mu, noise))))
            trace.add(t + k * stage_gap, STAGE_NAMES[k % len(STAGE_NAMES)], est, actual, f"r{r}")
            made += 1
    return trace.sort()


def from_ledger(url: str | None, days: float) -> Trace:
    """The settled jobs of the last ``days`` days of a real ledger, as a trace.

    Arrivals are ``created_at`` shifted so that the first job arrives at 0.

    Raises:
        TraceError: the ledger has no settled jobs in that window.
    """
    if days <= 0:
        raise TraceError(f"days={days} must be > 0")
    from ..ledger import Ledger

    ledger = Ledger(url)
    try:
        rows = ledger.history(days)
    finally:
        ledger.close()
    if not rows:
        raise TraceError(f"ledger {ledger.url}: no settled jobs in the last {days:g} days")
    t0 = min(float(r["created_at"]) for r in rows)
    trace = Trace(source=f"ledger {ledger.url}, last {days:g} days")
    for r in rows:
        trace.add(float(r["created_at"]) - t0, r["stage"], max(1, int(r["est"])), int(r["actual"] or 0), r.get("run_key"),
                  r.get("rate_cost"))  # fmt: skip
    return trace.sort()
