"""``lane simulate``: a week of traffic in seconds, before you trust a lane.

A discrete-event simulation of one lane and one slow worker. The ``lane``
policy is the ledger's own :func:`lane_plugin.policy.admit` (the same code,
not a copy); the baselines live in :mod:`lane_plugin.sim.policies`.

Model (the ledger's semantics):

- a job arrives and waits; at a tick the policy chooses jobs to lease:
  ``reserved += est``, ``leased += 1``, and its ``rate_cost`` (default ``est``)
  enters the sliding rate window (:mod:`lane_plugin.sim.window`);
- leased jobs queue at the worker in admission order. The worker has
  ``workers`` parallel slots and serves a job in ``service_base +
  service_per_token * actual`` seconds. A *cold drainer* sleeps
  ``sleep_seconds`` at the end of every ``sleep_every`` seconds: it finishes
  what it is running but starts nothing while asleep;
- a lease the worker has not started within ``lease_seconds`` expires: the job
  goes back to waiting (keeping its place in the aging order), or is parked
  after ``max_attempts`` leases. A running job renews its lease;
- a job's *wait* is from its arrival until the worker starts it (admission
  wait plus the worker's queue); a job not started by the horizon counts
  with its wait so far (a lower bound). *Starved*: never admitted although a
  later job was, after waiting ``starve_after`` or more;
- on completion the job settles: ``reserved -= est``, ``spent += actual``;
- with ``period_seconds`` set, ``spent`` restarts at every multiple of it
  (the lane's daily reset; trace time 0 is a UTC midnight); overspend is
  counted per period;
- with ``deadline`` set, a job still waiting that long after it arrived is
  parked (the tail).

Ticks happen at every arrival, completion, lease expiry and worker wake, plus
when the rate window has slid enough for a job it blocked. A tick is skipped when
no lease slot is free or nothing waits: the policy could not admit anything.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from heapq import heappop, heappush

from ..policy import LANE_DEFAULTS as D
from ..policy import Candidate, LanePolicy, never_fits
from .policies import POLICIES, USES_EST_HEAP, LaneQueue, candidate_for
from .results import SimResult, big_threshold, percentile
from .traffic import Trace
from .window import RateWindow

INF = math.inf
WAITING, LEASED, RUNNING, DONE, PARKED, FUTURE, REFUSED = range(7)
DONE_EV, EXPIRE_EV, WAKE_EV = range(3)
PERIODS = {"none": None, "daily": 86_400.0, "monthly": 30 * 86_400.0}  # monthly: 30 days


@dataclass(frozen=True)
class SimConfig:
    """One lane, one worker, one scenario. Field names follow the ledger's lane."""

    ceiling: int = D["ceiling"]
    allowance: int = D["allowance"]
    start_fraction: float = D["start_fraction"]
    burst_tokens: int = D["burst_tokens"]
    window_seconds: float = D["window_seconds"]
    max_leased: int = D["max_leased"]
    lease_seconds: float = D["lease_seconds"]
    max_wait_seconds: float = D["max_wait_seconds"]
    max_attempts: int = D["max_attempts"]
    rate_basis: str = D["rate_basis"]
    period_seconds: float | None = None
    workers: int = 1
    service_base: float = 1.0
    service_per_token: float = 0.001
    sleep_seconds: float = 0.0
    sleep_every: float = 0.0
    preflight: bool = False
    deadline: float | None = None
    count_slots: int | None = None
    horizon: float | None = None
    starve_after: float = 3_600.0

    def __post_init__(self) -> None:
        positive = ("ceiling", "allowance", "burst_tokens", "max_leased", "max_attempts", "workers", "lease_seconds")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")
        if not 0 < self.start_fraction <= 1:
            raise ValueError(f"start_fraction={self.start_fraction!r} must be in (0, 1]")
        for name in ("window_seconds", "max_wait_seconds", "service_base", "service_per_token",
                     "sleep_seconds", "sleep_every", "starve_after"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 0")
        if self.sleep_seconds and not self.sleep_every > self.sleep_seconds:
            raise ValueError(f"sleep_every={self.sleep_every!r} must be > sleep_seconds={self.sleep_seconds!r}")
        for name in ("period_seconds", "deadline", "count_slots", "horizon"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name}={value!r} must be > 0 (or unset)")

    @property
    def lane_policy(self) -> LanePolicy:
        """The :class:`LanePolicy` the ledger would build from these fields."""
        return LanePolicy.of(self)

    @property
    def slots(self) -> int:
        """Lease slots of the count baseline (defaults to ``max_leased``)."""
        return self.count_slots or self.max_leased


def refused_at_intake(trace: Trace, cfg: SimConfig) -> list[bool]:
    """Jobs the ledger refuses at intake because they could never fit the lane."""
    pol = cfg.lane_policy
    rates = trace.rate_cost or [None] * len(trace)
    seen: set[str] = set()
    out = []
    for e, rk, r in zip(trace.est, trace.run_key, rates):  # a run's first job starts it; no run: no start
        out.append(never_fits(pol, e, starts_run=rk is not None and rk not in seen, rate_cost=r) is not None)
        if rk is not None:
            seen.add(rk)
    return out


class Sim:
    """One policy over one trace. Build it, call :meth:`run` once."""

    def __init__(self, trace: Trace, cfg: SimConfig, policy: str, *, refused: list[bool] | None = None,
                 record: bool = False) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r} is not one of {', '.join(POLICIES)}")
        self.trace, self.cfg, self.policy, self.record = trace, cfg, policy, record
        self._select = POLICIES[policy]
        n = len(trace)
        self.n = n
        self.est = trace.est
        self.rate = [e if r is None else r for e, r in zip(trace.est, trace.rate_cost or [None] * n)]
        self.waiting_since = trace.arrival  # a requeued job keeps its place in the aging order
        self.refused = refused if refused is not None else refused_at_intake(trace, cfg)
        self.state = bytearray([FUTURE]) * n
        self.admitted_at = [-1.0] * n
        self.started_at = [-1.0] * n
        self.lease_no = [0] * n
        self._cands: list[tuple[int, Candidate] | None] = [None] * n
        self._width = max(7, len(str(n)))
        self.age: list[int] = []  # waiting jobs by (arrival, index): arrival order == index order
        self.by_est: list[tuple[int, int]] = []  # waiting jobs by (est, index)
        self._use_est = policy in USES_EST_HEAP
        self.spent = self.reserved = self.leased = 0
        self.window = RateWindow(cfg.window_seconds)
        self._charges: dict[int, object] = {}  # rate charges to true up at settlement (basis "actual")
        self.started: set[str] = set()
        self.events: list[tuple] = []
        self._seq = 0
        self._next_window_wake = -INF
        self._next_worker_wake = -INF
        self.free = cfg.workers
        self.queue: deque[tuple[int, int]] = deque()
        self.busy = 0.0
        self.n_waiting = 0
        self.cap = cfg.slots if policy == "count" else cfg.max_leased
        self.t0 = trace.arrival[0] if n else 0.0
        self.horizon = cfg.horizon if cfg.horizon is not None else (trace.arrival[-1] if n else 0.0)
        self.period_start = self.t0 // cfg.period_seconds * cfg.period_seconds if cfg.period_seconds else 0.0
        self.over_ceiling = self.over_allowance = self.peak_period_spent = 0
        self.total_spent = self.done = self.parked = self.expired = 0
        self.max_admitted_arrival = -INF
        self.series_t: list[float] = []
        self.series_spent: list[int] = []
        self.log: list[tuple] = []
        self.lane_queue = LaneQueue(self) if policy == "lane" else None

    # -- views the policies use -------------------------------------------------
    def job_id(self, j: int) -> str:
        """Stable id that sorts like the index (the policy breaks ties on id)."""
        return f"j{j:0{self._width}d}"

    def index_of(self, c: Candidate) -> int:
        return int(c.id[1:])

    def candidate(self, j: int) -> Candidate:
        """The ``lane`` policy's candidate for job ``j`` (cached until the reserve profile is refit)."""
        hit = self._cands[j]
        version = self.lane_queue.runs.version
        if hit is None or hit[0] != version:
            hit = self._cands[j] = (version, candidate_for(self, j))
        return hit[1]

    def asleep(self, t: float) -> bool:
        """Whether the cold drainer is asleep at ``t`` (the last part of each cycle)."""
        cfg = self.cfg
        return bool(cfg.sleep_seconds) and (t % cfg.sleep_every) >= cfg.sleep_every - cfg.sleep_seconds

    def stopped(self, t: float) -> bool:
        """The lane is stopped when its preflight ping fails: the worker is asleep."""
        return self.cfg.preflight and self.asleep(t)

    # -- events -----------------------------------------------------------------
    def _push(self, t: float, kind: int, j: int = -1, no: int = 0) -> None:
        self._seq += 1
        heappush(self.events, (t, self._seq, kind, j, no))

    def _make_waiting(self, j: int) -> None:
        self.state[j] = WAITING
        self.n_waiting += 1
        heappush(self.age, j)
        if self._use_est:
            heappush(self.by_est, (self.est[j], j))
        if self.lane_queue is not None:
            self.lane_queue.push(j)

    def _roll(self, t: float) -> None:
        cfg = self.cfg
        if cfg.period_seconds and t >= self.period_start + cfg.period_seconds:
            self._close_period()
            self.period_start = t // cfg.period_seconds * cfg.period_seconds
            self.series_t.append(self.period_start)
            self.series_spent.append(0)

    def _close_period(self) -> None:
        cfg = self.cfg
        self.over_ceiling += max(0, self.spent - cfg.ceiling)
        self.over_allowance += max(0, self.spent - cfg.allowance)
        self.peak_period_spent = max(self.peak_period_spent, self.spent)
        self.spent = 0

    def _lease(self, j: int, t: float) -> None:
        est = self.est[j]
        self.state[j] = LEASED
        self.lease_no[j] += 1
        self.n_waiting -= 1
        self.leased += 1
        self.reserved += est
        charge = self.window.charge(t, self.rate[j])
        if self.cfg.rate_basis == "actual":
            self._charges[j] = charge
        if self.admitted_at[j] < 0:
            self.admitted_at[j] = t
            self.max_admitted_arrival = max(self.max_admitted_arrival, self.trace.arrival[j])
        rk = self.trace.run_key[j]
        if rk is not None:
            self.started.add(rk)
        self._push(t + self.cfg.lease_seconds, EXPIRE_EV, j, self.lease_no[j])
        self.queue.append((j, self.lease_no[j]))

    def _settle(self, j: int, t: float) -> None:
        actual = self.trace.actual[j]
        self.state[j] = DONE
        self.free += 1
        self.leased -= 1
        self.reserved -= self.est[j]
        if self._charges:
            self.window.true_up(self._charges.pop(j, None), actual)
        self.spent += actual
        self.total_spent += actual
        self.done += 1
        self.series_t.append(t)
        self.series_spent.append(self.spent)
        if self.record:
            self.log.append(("settle", t, self.job_id(j), actual))

    def _expire(self, j: int, t: float) -> None:
        self.leased -= 1
        self.reserved -= self.est[j]
        self.expired += 1
        if self.record:
            self.log.append(("expire", t, self.job_id(j)))
        if self.lease_no[j] >= self.cfg.max_attempts:
            self.state[j] = PARKED
            self.parked += 1
        else:
            self._make_waiting(j)

    def _park_overdue(self, t: float) -> None:
        deadline = self.cfg.deadline
        age, state, since = self.age, self.state, self.waiting_since
        while age:
            j = age[0]
            if state[j] != WAITING:
                heappop(age)
                continue
            if since[j] + deadline > t:
                break
            heappop(age)
            self.park(j, t)

    def park(self, j: int, t: float) -> None:
        """A waiting job leaves the queue for the tail (past its deadline, or it cannot fit)."""
        self.state[j] = PARKED
        self.n_waiting -= 1
        self.parked += 1
        if self.record:
            self.log.append(("park", t, self.job_id(j)))

    def _tick(self, t: float) -> None:
        if self.n_waiting <= 0 or self.leased >= self.cap:
            return  # the policy could not admit anything: the ledger's tick is a no-op
        admitted, burst_need = self._select(self, t)
        for j in admitted:
            self._lease(j, t)
        if self.record:
            self.log.append(("tick", t, [self.job_id(j) for j in admitted]))
        if not admitted and self.policy == "lane" and self.stopped(t):
            self._wake_worker_at(t)  # the preflight passes again when the worker wakes
        if burst_need:
            self._wake_when_window_frees(t, burst_need)

    def _wake_when_window_frees(self, t: float, need: int) -> None:
        """Tick again when the sliding window has room for ``need`` rate tokens."""
        nxt = self.window.free_at(t, self.cfg.burst_tokens - need)
        if nxt is not None and nxt > t and nxt != self._next_window_wake:
            self._next_window_wake = nxt
            self._push(nxt, WAKE_EV)

    def _wake_worker_at(self, t: float) -> None:
        wake = (t // self.cfg.sleep_every + 1) * self.cfg.sleep_every
        if wake != self._next_worker_wake:
            self._next_worker_wake = wake
            self._push(wake, WAKE_EV)

    def _start_work(self, t: float) -> None:
        cfg, queue, state, lease_no = self.cfg, self.queue, self.state, self.lease_no
        while self.free > 0 and queue:
            if self.asleep(t):
                self._wake_worker_at(t)
                return
            j, no = queue.popleft()
            if state[j] != LEASED or lease_no[j] != no:
                continue  # the lease expired before the worker got to it
            state[j] = RUNNING
            if self.started_at[j] < 0:
                self.started_at[j] = t
            end = t + cfg.service_base + cfg.service_per_token * self.trace.actual[j]
            self.busy += max(0.0, min(end, self.horizon) - max(t, self.t0))
            self.free -= 1
            self._push(end, DONE_EV, j)

    # -- the loop ---------------------------------------------------------------
    def run(self) -> SimResult:
        """Simulate up to the horizon and return the figures."""
        wall = time.perf_counter()
        arrival, events, state, refused = self.trace.arrival, self.events, self.state, self.refused
        n, horizon, deadline = self.n, self.horizon, self.cfg.deadline
        ai = 0
        while True:
            ta = arrival[ai] if ai < n else INF
            te = events[0][0] if events else INF
            t = ta if ta < te else te
            if t == INF or t > horizon:
                break
            self._roll(t)
            if te <= ta:
                _, _, kind, j, no = heappop(events)
                if kind == DONE_EV:
                    self._settle(j, t)
                elif kind == EXPIRE_EV:
                    if state[j] != LEASED or self.lease_no[j] != no:
                        continue  # started or settled in time: nothing expires
                    self._expire(j, t)
            else:
                j = ai
                ai += 1
                if refused[j]:
                    state[j] = REFUSED
                    continue
                self._make_waiting(j)
                if self.record:
                    self.log.append(("submit", t, self.job_id(j)))
            if deadline is not None:
                self._park_overdue(t)
            self._tick(t)
            self._start_work(t)
        self._close_period()
        return self._result(ai, time.perf_counter() - wall)

    def _result(self, arrived: int, wall: float) -> SimResult:
        cfg, arrival, state = self.cfg, self.trace.arrival, self.state
        big = big_threshold(self.trace, self.refused)
        waits: list[float | None] = [None] * self.n
        all_w, big_w = [], []
        starved = 0
        for j in range(arrived):
            s = state[j]
            if s == REFUSED or s == PARKED and self.started_at[j] < 0:
                continue
            if self.started_at[j] >= 0:
                w = self.started_at[j] - arrival[j]
            else:  # not started yet: censored at the horizon (a lower bound)
                w = self.horizon - arrival[j]
                if self.admitted_at[j] < 0 and arrival[j] < self.max_admitted_arrival and w >= cfg.starve_after:
                    starved += 1
            waits[j] = w
            all_w.append(w)
            if self.est[j] >= big:
                big_w.append(w)
        jobs = sum(1 for j in range(arrived) if state[j] != REFUSED)
        span = max(self.horizon - self.t0, 1e-9)
        return SimResult(
            policy=self.policy,
            jobs=jobs,
            done=self.done,
            spent=self.total_spent,
            over_ceiling=self.over_ceiling,
            over_allowance=self.over_allowance,
            busy_pct=100.0 * self.busy / (cfg.workers * span),
            wait_p50=percentile(all_w, 0.5),
            wait_p99=percentile(all_w, 0.99),
            big_wait_p50=percentile(big_w, 0.5),
            big_wait_p99=percentile(big_w, 0.99),
            starved=starved,
            parked=self.parked,
            expired=self.expired,
            waiting_at_end=self.n_waiting,
            wall_seconds=wall,
            jobs_per_s=jobs / wall if wall > 0 else INF,
            peak_period_spent=self.peak_period_spent,
            series_t=self.series_t,
            series_spent=self.series_spent,
            waits=waits,
            log=self.log,
        )


def simulate(trace: Trace, cfg: SimConfig, policies: list[str] | tuple[str, ...] = tuple(POLICIES),
             *, record: bool = False) -> list[SimResult]:
    """Run every policy over the same trace and lane, side by side.

    Args:
        trace: the traffic (see :mod:`lane_plugin.sim.traffic`).
        cfg: the lane and the worker.
        policies: names from :data:`lane_plugin.sim.policies.POLICIES`.
        record: keep an event log (submit/tick/settle/expire/park) per policy.

    Example:
        >>> from lane_plugin.sim.traffic import generate
        >>> res = simulate(generate(300, seed=1, days=0.1), SimConfig(), ["lane"])
        >>> res[0].policy, res[0].over_ceiling
        ('lane', 0)
    """
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"policy={unknown[0]!r} is not one of {', '.join(POLICIES)}")
    if not len(trace):
        raise ValueError("trace has no jobs")
    refused = refused_at_intake(trace, cfg)
    return [Sim(trace, cfg, p, refused=refused, record=record).run() for p in policies]
