"""Traffic for ``lane simulate``: the :class:`Trace`, a generator, or a ledger's history.

Every source yields the same thing, a :class:`Trace`: jobs sorted by arrival
time (seconds from the start of the trace), each with its stage, the estimate
the lane admits on (``est``, what the budget is charged until settlement),
what the provider's rate limiter charges at request time (``rate_cost``,
``est`` unless the source says otherwise), the tokens it really costs
(``actual``), its input and output tokens where the source knows them, and
the run it belongs to. Trace files are read by :mod:`lane_plugin.sim.readers`.
No pandas here: the CLI must start fast and a trace is a few flat lists.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from ..errors import TraceError

MIXES = ("lognormal", "bimodal", "uniform")
STAGE_NAMES = ("draft", "refine", "summarize", "review", "publish")
MAX_JOBS = 10_000_000  # generated jobs: ~0.55 kB each (125 MB RSS at 100,000), so ~6 GB and an hour here


PER_JOB = ("arrival", "stage", "est", "actual", "run_key", "rate_cost", "input_tokens", "output_tokens", "tenant")


@dataclass
class Trace:
    """Jobs in arrival order. Parallel lists, one entry per job.

    ``rate_cost``, ``input_tokens`` and ``output_tokens`` hold None where the
    source does not say: the rate limiter is then charged ``est``
    (:meth:`rate_costs`) and the worker's service time follows ``actual``.

    Example:
        >>> tr = Trace()
        >>> tr.add(0.0, "draft", 300, 280, rate_cost=1_324, input_tokens=44, output_tokens=236)
        >>> tr.add(1.0, "draft", 100, 90)
        >>> tr.rate_costs()
        [1324, 100]
    """

    arrival: list[float] = field(default_factory=list)
    stage: list[str] = field(default_factory=list)
    est: list[int] = field(default_factory=list)
    actual: list[int] = field(default_factory=list)
    run_key: list[str | None] = field(default_factory=list)
    rate_cost: list[int | None] = field(default_factory=list)
    source: str = ""
    input_tokens: list[int | None] = field(default_factory=list)
    output_tokens: list[int | None] = field(default_factory=list)
    tenant: list[str | None] = field(default_factory=list)  # who the job belongs to in its lane (None: default)

    def __len__(self) -> int:
        return len(self.arrival)

    def add(
        self,
        arrival: float,
        stage: str,
        est: int,
        actual: int,
        run_key: str | None = None,
        rate_cost: int | None = None,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        tenant: str | None = None,
    ) -> None:
        """Append one job (call :meth:`sort` afterwards if arrivals are unordered)."""
        self.arrival.append(float(arrival))
        self.stage.append(stage)
        self.est.append(int(est))
        self.actual.append(int(actual))
        self.run_key.append(run_key)
        self.rate_cost.append(None if rate_cost is None else int(rate_cost))
        self.input_tokens.append(None if input_tokens is None else int(input_tokens))
        self.output_tokens.append(None if output_tokens is None else int(output_tokens))
        self.tenant.append(tenant)

    def sort(self) -> Trace:
        """Order jobs by arrival time (stable: ties keep their input order)."""
        idx = sorted(range(len(self)), key=self.arrival.__getitem__)
        if idx != list(range(len(self))):
            for name in PER_JOB:
                column = getattr(self, name)
                setattr(self, name, [column[i] for i in idx])
        return self

    def rate_costs(self) -> list[int]:
        """What the provider's rate limiter charges each job at request time (``est`` if unknown)."""
        return [e if r is None else r for e, r in zip(self.est, self.rate_cost)]

    @property
    def span(self) -> float:
        """Seconds from the first to the last arrival."""
        return self.arrival[-1] - self.arrival[0] if self.arrival else 0.0


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
    tenants: list[tuple[str, float, float]] | None = None,
) -> Trace:
    """Generate pipeline traffic: Poisson runs of ``stages`` jobs each.

    The first stage of a run arrives at the run's Poisson time. The simulator
    submits stage k+1 when stage k settles (``SimConfig.chain``); the recorded
    arrival ``k * stage_gap`` after the first stage is used only with
    ``chain=False`` (and by :func:`lane_plugin.sim.readers.write_csv`).
    Input and output tokens are unknown: the worker's time follows ``actual``.

    Args:
        jobs: total jobs (the last run may have fewer stages).
        mix: estimate distribution, one of ``MIXES``.
        drift: actual/estimate ratio of the estimator (1.3 = under-estimates by 30%).
        noise: sigma of the mean-1 lognormal noise on each actual.
        seed: random seed; the same seed gives the same trace.
        days: the trace spans this many days.
        stages: jobs per run (all with the run's ``run_key``).
        stage_gap: recorded seconds between stages of one run (unchained replay only).
        median: median estimate in tokens.
        max_est: clip estimates to this (e.g. the lane's burst), or None.
        tenants: ``[(name, weight, share)]`` (:func:`lane_plugin.sim.tenants.parse_tenants`): each run
            belongs to one, drawn by share; the weights go to the simulation's settings.
    """
    if not 0 < jobs <= MAX_JOBS:  # an extra zero in --jobs ran the machine out of memory
        raise TraceError(f"jobs={jobs} must be > 0 and at most {MAX_JOBS:,}")
    if mix not in MIXES:
        raise TraceError(f"mix={mix!r} is not one of {', '.join(MIXES)}")
    for name, value in (("drift", drift), ("days", days), ("median", median)):
        if not (math.isfinite(value) and value > 0):  # NaN passed `<= 0` and failed later, naming no field
            raise TraceError(f"{name}={value} must be a finite number > 0")
    if not (math.isfinite(noise) and noise >= 0):
        raise TraceError(f"noise={noise} must be a finite number >= 0")
    if stages < 1:
        raise TraceError(f"stages={stages} must be >= 1")
    rng = random.Random(seed)
    runs = math.ceil(jobs / stages)
    mean_gap = days * 86_400.0 / runs
    mu = -noise * noise / 2.0  # mean-1 lognormal
    trace = Trace(source=f"generated: {jobs} jobs, {mix}, drift {drift}, seed {seed}, {days:g} days")
    t = 0.0
    made = 0
    from .tenants import pick

    for r in range(runs):
        t += rng.expovariate(1.0 / mean_gap) if r else 0.0
        tenant = pick(tenants, rng.random()) if tenants else None
        for k in range(min(stages, jobs - made)):
            est = max(1, int(round(_draw_est(rng, mix, median))))
            if max_est is not None:
                est = min(est, max_est)
            actual = max(0, int(round(est * drift * rng.lognormvariate(mu, noise))))
            trace.add(t + k * stage_gap, STAGE_NAMES[k % len(STAGE_NAMES)], est, actual, f"r{r}", tenant=tenant)
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

    ledger = Ledger(url, create=False)  # a read: a typo in --db must not leave an empty ledger behind
    try:
        rows = ledger.history(days)
    finally:
        ledger.close()
    if not rows:
        raise TraceError(f"ledger {ledger.url}: no settled jobs in the last {days:g} days")
    t0 = min(float(r["created_at"]) for r in rows)
    trace = Trace(source=f"ledger {ledger.url}, last {days:g} days")
    for r in rows:
        trace.add(
            float(r["created_at"]) - t0,
            r["stage"],
            max(1, int(r["est"])),
            int(r["actual"] or 0),
            r.get("run_key"),
            r.get("rate_cost"),
            tenant=r.get("tenant"),
        )
    return trace.sort()
