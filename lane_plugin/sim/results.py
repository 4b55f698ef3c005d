"""What one simulated policy did with one trace, and the order statistics used to say it.

Waits run from a job's submission until the worker starts it. Three groups
are reported apart, none dropped:

- ``wait_p50`` / ``wait_p99`` (and the top decile's): jobs admitted and
  started; with a ``horizon``, admitted jobs not started by then count with
  their wait so far (a lower bound);
- ``parked_wait_*``: submission until parked (deadline, or attempts exhausted);
- ``never_admitted_wait_*``: jobs still waiting at the end (submission until
  the end: a lower bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .chains import DONE, FUTURE, PARKED, REFUSED
from .limits import bound_by
from .traffic import Trace

INF = math.inf


@dataclass
class SimResult:
    """What one policy did with one trace (``--json`` keys: only ever added to)."""

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
    over_burst: int = 0
    over_burst_actual: int = 0
    runs: int = 0
    runs_started: int = 0
    runs_finished: int = 0
    stranded_tokens: int = 0
    budget_used: float = 0.0
    periods: int = 1
    refused: int = 0
    not_submitted: int = 0
    never_admitted: int = 0
    never_admitted_wait_p50: float = math.nan
    never_admitted_wait_p99: float = math.nan
    parked_wait_p50: float = math.nan
    parked_wait_p99: float = math.nan
    end_s: float = 0.0
    stalled: bool = False
    estimator: dict | None = None  # with --estimator: its figures over this policy's run (estimating.figures)
    # Several tenants in the trace (lane_plugin.sim.tenants): per tenant tokens served, waits p50/p99 and
    # runs finished; the largest weighted-service gap between two backlogged tenants; Jain's index.
    tenants: dict | None = None
    # The lane's limits (tokens = the burst window): seconds each kept the head of the queue waiting, the
    # binding one (the most; None: none did), and units past each limit other than tokens in a sliding window.
    limit_held: dict = field(default_factory=dict)
    bound_by: str | None = None
    over_limits: dict = field(default_factory=dict)
    fair_gap: float | None = None
    jain: float | None = None
    # Rule 12's quantile form (SimConfig.overtake_slack): the largest estimate any key read over the run's p99 of V
    # (the rate tokens waiting at arrivals); the lane's p99 of tokens ahead is within slack x max(1, this) x
    # token-fifo's (lane_plugin.policy.slack): at most 1, the estimate cost the bound nothing.
    slack_estimate_ratio: float | None = None
    # The p99 of V the keys read (learned before the run, SimConfig.overtake_learned or its second day's replay), and
    # the wall seconds that replay took (in wall_seconds and jobs_per_s too: a user waits for both).
    overtake_q: int | None = None
    learning_seconds: float = 0.0
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


def estimate_ratio(arrivals: list[tuple[int, int]], q: float) -> float | None:
    """The largest estimate of ``(V, estimate)`` arrivals over the ``q``-quantile of every ``V`` (inf: that is 0)."""
    if not arrivals:
        return None
    p = percentile([v for v, _ in arrivals], q)
    top = max(e for _, e in arrivals)
    return top / p if p else (0.0 if top == 0 else math.inf)


def learned_before(result: SimResult, q: int | None, seconds: float) -> None:
    """Mark ``result`` (rule 12 on) with the ``Q`` its keys read (None: learning) and the ``seconds`` its second day's
    replay of the learning day took, counted in its wall time and jobs per second too."""
    result.overtake_q = q
    if seconds:
        result.learning_seconds = seconds
        result.wall_seconds += seconds
        result.jobs_per_s = result.jobs / result.wall_seconds


def big_threshold(trace: Trace, refused: list[bool]) -> int:
    """Smallest estimate of the largest decile of (admissible) jobs."""
    ests = [e for e, r in zip(trace.est, refused) if not r]
    return percentile(ests, 0.9) if ests else 0


def collect(sim, end: float, wall: float) -> SimResult:
    """The figures of a finished :class:`lane_plugin.sim.engine.Sim` whose clock stopped at ``end``."""
    cfg, state, arrival, est = sim.cfg, sim.state, sim.arrival, sim.est
    admitted_at, started_at, parked_at = sim.admitted_at, sim.started_at, sim.parked_at
    big = big_threshold(sim.trace, sim.refused)
    waits: list[float | None] = [None] * sim.n
    served, big_w, never, parked_w = [], [], [], []
    starved = refused = future = 0
    for j in range(sim.n):
        s = state[j]
        if s == FUTURE:
            future += 1
            continue
        if s == REFUSED:
            refused += 1
            continue
        if s == PARKED:
            parked_w.append(parked_at[j] - arrival[j])
            continue
        if admitted_at[j] < 0:  # still waiting at the end
            w = end - arrival[j]
            never.append(w)
            waits[j] = w
            if arrival[j] < sim.max_admitted_arrival and w >= cfg.starve_after:
                starved += 1
            continue
        w = (started_at[j] if started_at[j] >= 0 else end) - arrival[j]
        waits[j] = w
        served.append(w)
        if est[j] >= big:
            big_w.append(w)
    jobs = sim.n - future - refused
    span = max(end - sim.t0, 1e-9)
    runs = sim.runs.figures(state, admitted_at, sim.trace.actual)
    used, periods = budget_used(sim)
    per_tenant = tenant_figures(sim, waits) if sim.tenants is not None else None
    return SimResult(
        policy=sim.policy,
        jobs=jobs,
        done=sim.done,
        spent=sim.total_spent,
        over_ceiling=sim.over_ceiling,
        over_allowance=sim.over_allowance,
        busy_pct=100.0 * sim.busy / (cfg.workers * span),
        wait_p50=percentile(served, 0.5),
        wait_p99=percentile(served, 0.99),
        big_wait_p50=percentile(big_w, 0.5),
        big_wait_p99=percentile(big_w, 0.99),
        starved=starved,
        parked=sim.parked,
        expired=sim.expired,
        waiting_at_end=sim.n_waiting,
        wall_seconds=wall,
        jobs_per_s=jobs / wall if wall > 0 else INF,
        peak_period_spent=sim.peak_period_spent,
        over_burst=sim.rate_meter.over,
        over_burst_actual=sim.actual_meter.over,
        budget_used=used,
        periods=periods,
        refused=refused,
        not_submitted=future,
        never_admitted=len(never),
        never_admitted_wait_p50=percentile(never, 0.5),
        never_admitted_wait_p99=percentile(never, 0.99),
        parked_wait_p50=percentile(parked_w, 0.5),
        parked_wait_p99=percentile(parked_w, 0.99),
        end_s=end - sim.t0,
        stalled=sim.stalled,
        series_t=sim.series_t,
        series_spent=sim.series_spent,
        waits=waits,
        log=sim.log,
        tenants=per_tenant,
        limit_held={unit: round(s, 3) for unit, s in sim.limits.held.items()},
        bound_by=bound_by(sim.limits.held),
        over_limits=sim.limits.over(),
        fair_gap=sim.tenants.gap if sim.tenants is not None else None,
        jain=sim.tenants.jain() if sim.tenants is not None else None,
        **runs,
    )


def tenant_figures(sim, waits: list[float | None]) -> dict:
    """Per tenant: tokens served (settled), waits p50/p99 (of the jobs admitted), runs finished of runs."""
    book, state, run_key = sim.tenants, sim.state, sim.trace.run_key
    out: dict = {}
    runs: dict[str, tuple[str, bool]] = {}
    for j in range(sim.n):
        name = book.of[j]
        t = out.setdefault(name, {"weight": book.weights[name], "jobs": 0, "tokens": book.tokens[name], "waits": []})
        t["jobs"] += 1
        if waits[j] is not None and sim.admitted_at[j] >= 0:
            t["waits"].append(waits[j])
        rk = run_key[j]
        if rk is not None:
            _, ok = runs.get(rk, (name, True))
            runs[rk] = (name, ok and state[j] == DONE)
    for name, t in out.items():
        w = t.pop("waits")
        t["wait_p50"], t["wait_p99"] = percentile(w, 0.5), percentile(w, 0.99)
        mine = [ok for n, ok in runs.values() if n == name]
        t["runs"], t["runs_finished"] = len(mine), sum(mine)
    total = sum(t["tokens"] for t in out.values()) or 1
    for t in out.values():
        t["share"] = t["tokens"] / total
    return out


def budget_used(sim) -> tuple[float, int]:
    """Spent over the sum of the ceilings of the periods in which traffic arrived.

    Without a period the whole simulation is one period. With one, a period
    counts when a run started (or a single call arrived) in it: periods after
    the last arrival only drain the backlog and are left out of both sums.

    Returns:
        The share (1.0 = every counted ceiling spent exactly) and the number of periods counted.
    """
    p = sim.cfg.period_seconds
    if not p:
        return sim.total_spent / sim.cfg.ceiling, 1
    arrival = sim.trace.arrival
    counted = {int(arrival[j] // p) for j in sim.runs.static if sim.state[j] != FUTURE}
    if not counted:
        return 0.0, 0
    spent = sum(v for k, v in sim.period_spent.items() if k in counted)
    return spent / (sim.cfg.ceiling * len(counted)), len(counted)


__all__ = ["SimResult", "big_threshold", "budget_used", "collect", "percentile"]
