"""``lane simulate``: a week of traffic in seconds, before you trust a lane.

A discrete-event simulation of one lane and one slow worker. The ``lane``
policy is the ledger's own :func:`lane_plugin.policy.admit` (the same code,
not a copy); the baselines live in :mod:`lane_plugin.sim.policies`. Every
policy obeys the same lease cap and the same sliding burst window.

Model (the ledger's semantics):

- a job is submitted and waits; at a tick the policy chooses jobs to lease:
  ``reserved += est``, ``leased += 1``, and the job's ``rate_cost`` enters
  the sliding burst window (:class:`lane_plugin.sim.window.RateWindow`);
- runs are chained: the first stage of a run (and every single call) is submitted at its trace
  time, stage k+1 when stage k settles (``SimConfig.chain``; :mod:`lane_plugin.sim.chains`);
- leased jobs queue at the worker in admission order. The worker has
  ``workers`` parallel slots and serves a job in ``service_base`` plus
  ``service_per_output_token`` x its output tokens where the trace knows them,
  else ``service_per_token`` x its actual tokens. A *cold drainer* sleeps
  ``sleep_seconds`` at the end of every ``sleep_every`` seconds: it finishes
  what it is running but starts nothing while asleep;
- a lease the worker has not started within ``lease_seconds`` expires: the job
  goes back to waiting (keeping its place in the aging order), or is parked
  after ``max_attempts`` leases. A running job renews its lease;
- on completion the job settles: ``reserved -= est``, ``spent += actual``;
- with ``period_seconds`` set, ``spent`` restarts at every multiple of it (the lane's daily
  reset; trace time 0 is a UTC midnight); overspend is counted per period;
- with ``deadline`` set, a job still waiting that long after it was
  submitted is parked (the tail);
- with rule 12 on (``SimConfig.overtake_slack``, 1.25 by default as in the ledger), the ``lane`` policy runs a lane's
  second day: ``Q`` learned from a first replay of the same traffic run as its learning day (:func:`second_day`).

Ticks happen at every submission, completion, lease expiry and worker wake,
at every period rollover, and when the burst window frees room that a
waiting job was refused for. A tick is skipped when no lease slot is free or
nothing waits: the policy could not admit anything. Without a ``horizon``
the clock runs until nothing is left to do: the queue drained, or a rollover
found an idle lane that still admits nothing (``stalled``: those jobs can
never be admitted). With no period to reset the budget, the clock stops at
the last event: jobs still waiting then are ``stalled`` too.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from heapq import heappop, heappush

from ..policy import never_fits
from ..policy.slack import LEARN_SECONDS, learned_q
from .chains import (
    DONE,
    DONE_EV,
    EXPIRE_EV,
    FUTURE,
    LEASED,
    REFUSED,
    WAITING,
    WAKE_EV,
    Runs,
)
from .config import PERIODS, SimConfig, refused_at_intake
from .estimating import OnlineEstimator, figures
from .gcpause import paused_gc
from .limits import SimLimits
from .meter import OverBurst
from .parking import Parking
from .periods import BudgetPeriods
from .policies import EXTRA_POLICIES, LANE_POLICIES, POLICIES, USES_EST_HEAP, LaneQueue, policy_named
from .results import SimResult, collect, estimate_ratio, learned_before, percentile
from .tenants import TenantBook
from .traffic import Trace
from .views import PolicyView
from .window import RateWindow
from .worker import SlowWorker, service_times

INF = math.inf
PROGRESS_EVERY = 8_192  # loop turns between two progress reports

Progress = Callable[["Sim", float], None]


class Sim(PolicyView, BudgetPeriods, SlowWorker, Parking):
    """One policy over one trace. Build it, call :meth:`run` once."""

    def __init__(
        self,
        trace: Trace,
        cfg: SimConfig,
        policy: str,
        *,
        refused: list[bool] | None = None,
        record: bool = False,
        runs: Runs | None = None,
        progress: Progress | None = None,
    ) -> None:
        select = policy_named(policy)
        if select is None:
            raise ValueError(f"policy={policy!r} is not one of {', '.join([*POLICIES, *EXTRA_POLICIES])}")
        self.trace, self.cfg, self.policy, self.record, self.progress = trace, cfg, policy, record, progress
        self._select = select
        n = len(trace)
        self.n = n
        # With an estimator, each job's est (and est_var, its spread) is set when it is submitted.
        self.estimator = OnlineEstimator(cfg.estimator, trace, warmup=cfg.warmup) if cfg.estimator else None
        self.est = list(trace.est) if self.estimator is not None else trace.est
        self.var = [0] * n
        self.reserved_var = 0
        self._runs_seen: set[str] = set()
        self.rate = trace.rate_costs()
        self.service = service_times(trace, cfg)
        self.runs = runs if runs is not None else Runs.of(trace, chain=cfg.chain)
        self.arrival = list(trace.arrival)  # submission times: a chained stage's is set when it is submitted
        self.waiting_since = self.arrival  # a requeued job keeps its place in the aging order
        self.refused = refused if refused is not None else refused_at_intake(trace, cfg)
        self.state = bytearray([FUTURE]) * n
        self.admitted_at = [-1.0] * n
        self.started_at = [-1.0] * n
        self.parked_at = [-1.0] * n
        self.lease_no = [0] * n
        self._width = max(7, len(str(n)))
        self.age: list[tuple[float, int]] = []  # waiting jobs by (submitted, index)
        self.by_est: list[tuple[int, int]] = []  # waiting jobs by (est, index)
        self._use_age = policy in ("count", "token-fifo") or cfg.deadline is not None  # kept only where read
        # by_est is kept only where read (a lane: skip)
        self._use_est = policy in USES_EST_HEAP and (policy not in LANE_POLICIES or bool(cfg.period_seconds))
        self.spent = self.reserved = self.leased = 0
        # The burst window every policy obeys (rate_cost, sliding) and what it measures.
        self.window = RateWindow(cfg.window_seconds)
        self.rate_meter = OverBurst(cfg.burst_tokens, cfg.window_seconds)
        self.actual_meter = OverBurst(cfg.burst_tokens, cfg.window_seconds)
        self._charges: dict[int, object] = {}  # rate charges to true up at settlement (basis "actual")
        # The lane's other limits (requests, input and output tokens), and which limit held the queue and how long.
        self.limits = SimLimits(cfg.limits)
        self.held_by: str | None = None
        self.started: set[str] = set()
        self.events: list[tuple] = []
        self._arm: list[tuple] = []  # expiries of this instant's leases, pushed unless the job started
        self._seq = 0
        self._pending = 0  # wake-ups in the heap (window, worker, deadline): they may change what fits
        self._next_window_wake = -INF
        self._next_worker_wake = -INF
        self._next_deadline_wake = -INF
        self.free = cfg.workers
        self.queue: deque[tuple[int, int]] = deque()
        self.busy = 0.0
        self.n_waiting = 0
        self.cap = cfg.slots if policy == "count" else cfg.max_leased
        self.t0 = trace.arrival[0] if n else 0.0
        self.horizon = cfg.horizon if cfg.horizon is not None else INF
        p = cfg.period_seconds
        self.period_start = self.t0 // p * p if p else 0.0
        self.period_spent: dict[int, int] = {}
        self.over_ceiling = self.over_allowance = self.peak_period_spent = 0
        self.total_spent = self.done = self.parked = self.expired = 0
        self.max_admitted_arrival = -INF
        self.stalled = False
        self.series_t: list[float] = []
        self.series_spent: list[int] = []
        self.log: list[tuple] = []
        self.lane_queue = LaneQueue(self) if policy in LANE_POLICIES else None
        # Several tenants in the trace: their counters (the lane policy orders by them; every policy is measured).
        book = TenantBook(trace.tenant, dict(cfg.tenant_weights)) if len(set(trace.tenant)) > 1 else None
        self.tenants = book if book is not None and book.several else None

    # -- events -----------------------------------------------------------------
    def _push(self, t: float, kind: int, j: int = -1, no: int = 0) -> None:
        self._seq += 1
        if kind == WAKE_EV:
            self._pending += 1
        heappush(self.events, (t, self._seq, kind, j, no))

    def _submit(self, j: int, t: float) -> None:
        """Job ``j`` arrives at ``t``: refused at intake, or waiting."""
        if self.estimator is not None:
            self._estimate(j)
        if self.refused[j]:
            self.state[j] = REFUSED
            return
        self.arrival[j] = t
        self._make_waiting(j)
        if self.record:
            self.log.append(("submit", t, self.job_id(j)))

    def _estimate(self, j: int) -> None:
        """Estimate job ``j`` at its submission, as the gate would; refused if it can never fit."""
        est, var = self.est[j], self.var[j] = self.estimator.estimate(j)
        rk = self.trace.run_key[j]
        starts = rk is not None and rk not in self._runs_seen
        if rk is not None:
            self._runs_seen.add(rk)
        units = self.units(j) if self.limits else None
        self.refused[j] = (
            never_fits(
                self.cfg.lane_policy,
                est,
                starts_run=starts,
                rate_cost=self.rate[j],
                var=var,
                input_cost=units and units["input_tokens"],
                output_cost=units and units["output_tokens"],
            )
            is not None
        )

    def _make_waiting(self, j: int) -> None:
        self.state[j] = WAITING
        self.n_waiting += 1
        if self._use_age:
            heappush(self.age, (self.waiting_since[j], j))
        if self._use_est:
            heappush(self.by_est, (self.est[j], j))
        if self.lane_queue is not None:
            self.lane_queue.push(j)
        if self.tenants is not None:  # after the push: the lane queue places the job (and learns its estimate) first
            self.tenants.wait(j, self.lane_queue.prio(j) if self.lane_queue is not None else 0.0)

    def _lease(self, j: int, t: float) -> None:
        est, rc = self.est[j], self.rate[j]
        self.state[j] = LEASED
        if self.lane_queue is not None:
            self.lane_queue.left(j, leased=True)
        if self.tenants is not None:
            self.tenants.lease(j, est)
        self.lease_no[j] += 1
        self.n_waiting -= 1
        self.leased += 1
        self.reserved += est
        self.reserved_var += self.var[j]
        charge = self.window.charge(t, rc)
        if self.cfg.rate_basis == "actual":
            self._charges[j] = charge
        self.rate_meter.charge(t, rc)
        if self.limits:
            self.limits.charge(t, j, self.units(j))
        self.actual_meter.charge(t, self.trace.actual[j])
        if self.admitted_at[j] < 0:
            self.admitted_at[j] = t
            self.max_admitted_arrival = max(self.max_admitted_arrival, self.arrival[j])
        rk = self.trace.run_key[j]
        if rk is not None:
            self.started.add(rk)
        # its expiry, numbered now (the same order), enters the heap only if the job is not started this instant
        self._seq += 1
        self._arm.append((t + self.cfg.lease_seconds, self._seq, EXPIRE_EV, j, self.lease_no[j]))
        self.queue.append((j, self.lease_no[j]))

    def _settle(self, j: int, t: float) -> None:
        actual = self.trace.actual[j]
        self.state[j] = DONE
        self.free, self.leased = self.free + 1, self.leased - 1
        self.reserved -= self.est[j]
        self.reserved_var -= self.var[j]
        if self.estimator is not None:
            self.estimator.observe(j)
        if self._charges:
            self.window.true_up(self._charges.pop(j, None), actual)
        if self.limits:
            self.limits.settle(j, self.trace.output_tokens[j], t)
        self.spent, self.total_spent = self.spent + actual, self.total_spent + actual
        self.done += 1
        if self.tenants is not None:
            self.tenants.settle(j, self.est[j], actual)
        if self.lane_queue is not None:  # what the drift allowance learns from (the ledger's settlements)
            self.lane_queue.settle(self.est[j], actual)
        self.series_t.append(t)
        self.series_spent.append(self.spent)
        if self.record:
            self.log.append(("settle", t, self.job_id(j), actual))
        nxt = self.runs.next_stage[j]
        if nxt >= 0:
            self._submit(nxt, t)  # the next stage of the run: submitted as this one settles

    def _tick(self, t: float) -> int:
        limits = self.limits
        if self.n_waiting <= 0 or self.leased >= self.cap:
            limits.hold(t, None)
            return 0  # the policy could not admit anything: the ledger's tick is a no-op
        if self.tenants is not None:
            self.tenants.tick()
        self.held_by = None  # the policy names the limit that keeps the head waiting, if one does
        admitted, need = self._select(self, t)
        limits.hold(t, self.held_by)
        if limits.wake is not None:  # a limit kept a job out: tick again when its window has room
            if limits.wake != self._next_window_wake:
                self._next_window_wake = limits.wake
                self._push(limits.wake, WAKE_EV)
            limits.wake = None
        for j in admitted:
            self._lease(j, t)
        if self.record:
            self.log.append(("tick", t, [self.job_id(j) for j in admitted]))
        if not admitted and self.policy in LANE_POLICIES and self.stopped(t):
            self._wake_worker_at(t)  # the preflight passes again when the worker wakes
        if need:  # the window kept a job of `need` rate tokens out: tick again when it has room
            nxt = self.window.free_at(t, self.cfg.burst_tokens - need)
            if nxt is not None and nxt > t and nxt != self._next_window_wake:
                self._next_window_wake = nxt
                self._push(nxt, WAKE_EV)
        return len(admitted)

    # -- the loop ---------------------------------------------------------------
    def run(self) -> SimResult:
        """Simulate up to the horizon (default: until drained) and return the figures."""
        wall = time.perf_counter()
        arrival, events, state = self.trace.arrival, self.events, self.state
        static = self.runs.static
        n_static, horizon, deadline = len(static), self.horizon, self.cfg.deadline
        progress, turns = self.progress, 0
        if self.cfg.period_seconds and self.n:
            self._next_period(self.t0)
        ai = 0
        t_end = self.t0
        while True:
            ta = arrival[static[ai]] if ai < n_static else INF
            te = events[0][0] if events else INF
            t = ta if ta < te else te
            if t == INF or t > horizon:
                break
            self._roll(t)
            rollover = False
            if te <= ta:
                _, _, kind, j, no = heappop(events)
                if kind == DONE_EV:
                    self._settle(j, t)
                elif kind == EXPIRE_EV:
                    if state[j] != LEASED or self.lease_no[j] != no:
                        continue  # started or settled in time: nothing expires
                    self._expire(j, t)
                elif kind == WAKE_EV:
                    self._pending -= 1
                else:
                    rollover = True
            else:
                self._submit(static[ai], t)
                ai += 1
            if deadline is not None:
                self._park_overdue(t)
            admitted = self._tick(t)
            self._start_work(t)
            for ev in self._arm:  # the expiries of this instant's leases the worker did not start
                if state[ev[3]] == LEASED:
                    heappush(events, ev)
            self._arm.clear()
            if rollover:
                if not admitted and self.leased == 0 and self._pending == 0 and ai >= n_static:
                    if self.n_waiting > 0:  # a fresh period on an idle lane admits nothing: it never will
                        t_end = t
                    break
                self._next_period(t)
            else:
                t_end = t
            if progress is not None:
                turns += 1
                if turns >= PROGRESS_EVERY:
                    turns = 0
                    progress(self, t)
        end = horizon if horizon < INF else t_end
        self.limits.hold(end, None)
        self.stalled = horizon == INF and self.n_waiting > 0  # nothing left to happen, yet jobs wait
        self._close_period()
        result = collect(self, end, time.perf_counter() - wall)
        if self.estimator is not None:
            warm = self.estimator.warm
            counted = [warm[j] and state[j] == DONE for j in range(self.n)]
            result.estimator = figures(
                self.cfg.estimator, self.policy, self.est, self.trace.actual, counted, self.cfg.warmup
            ).as_dict()
        if progress is not None:
            progress(self, end)
        if (
            self.lane_queue is not None
            and self.lane_queue.backlog is not None
            and (self.lane_queue.learned is not None or self.lane_queue.running)  # (the learning day read none)
        ):
            result.slack_estimate_ratio = estimate_ratio(self.lane_queue.arrivals, self.lane_queue.backlog.q)
        if self.lane_queue is not None:  # a cycle back to this Sim: refcounting frees it, not a GC pass over the run
            self.lane_queue.sim = self.lane_queue.runs.sim = None
            if self.lane_queue.rooms is not None:  # (its callbacks are methods of the queue)
                self.lane_queue.rooms.release()
        return result


def simulate(
    trace: Trace,
    cfg: SimConfig,
    policies: list[str] | tuple[str, ...] = tuple(POLICIES),
    *,
    record: bool = False,
    progress: Progress | None = None,
) -> list[SimResult]:
    """Run every policy over the same trace and lane, side by side.

    Args:
        trace: the traffic (see :mod:`lane_plugin.sim.traffic`).
        cfg: the lane and the worker.
        policies: names from :data:`lane_plugin.sim.policies.POLICIES`, or ``lane-one-queue`` (the ledger's
            policy with the trace's tenants ignored: today's order, the baseline of the fair one).
        record: keep an event log (submit/tick/settle/expire/park) per policy.
        progress: called now and then with the running :class:`Sim` and its clock.

    Example:
        >>> from lane_plugin.sim.traffic import generate
        >>> res = simulate(generate(300, seed=1, days=0.1), SimConfig(), ["lane"])
        >>> res[0].policy, res[0].over_ceiling
        ('lane', 0)
    """
    unknown = [p for p in policies if policy_named(p) is None]
    if unknown:
        raise ValueError(f"policy={unknown[0]!r} is not one of {', '.join([*POLICIES, *EXTRA_POLICIES])}")
    if not len(trace):
        raise ValueError("trace has no jobs")
    refused = refused_at_intake(trace, cfg)
    runs = Runs.of(trace, chain=cfg.chain)
    # with an estimator each policy's run estimates (and refuses) at submission: its own copy
    out = []
    with paused_gc():
        for p in policies:
            start = time.perf_counter()
            day = second_day(trace, cfg, p, refused, runs)
            learning = time.perf_counter() - start if day is not cfg else 0.0
            own = list(refused) if cfg.estimator else refused
            result = Sim(trace, day, p, refused=own, record=record, runs=runs, progress=progress).run()
            if p in LANE_POLICIES and day.overtake_slack is not None:
                learned_before(result, day.overtake_learned, learning)
            out.append(result)
    return out


def second_day(trace: Trace, cfg: SimConfig, policy: str, refused: list[bool], runs: Runs) -> SimConfig:
    """``cfg`` for ``policy`` on the lane's second day with rule 12 on (``SimConfig.overtake_day`` 2): ``Q`` learned
    as the ledger's refit learns it, from the arrivals of a first replay of the same traffic run as the learning day
    (keys unbounded). ``cfg`` itself when the rule is off, ``Q`` is given, another day is asked for, the policy keeps
    no lane queue, or the replay had fewer arrivals than the warm-up (the lane is still learning)."""
    if policy not in LANE_POLICIES or cfg.overtake_slack is None or cfg.overtake_learned is not None:
        return cfg
    if cfg.overtake_day != 2:
        return cfg
    first = Sim(trace, replace(cfg, overtake_day=1), policy, refused=list(refused), runs=runs)
    first.run()
    assert first.lane_queue is not None
    queue = first.lane_queue
    day = (queue.arrived_at[-1] if queue.arrived_at else 0.0) - LEARN_SECONDS  # its last day, as the refit reads
    q = learned_q([v for (v, _), t in zip(queue.arrivals, queue.arrived_at) if t >= day])
    return replace(cfg, overtake_day=1) if q is None else replace(cfg, overtake_learned=q)


__all__ = ["PERIODS", "Sim", "SimConfig", "SimResult", "percentile", "refused_at_intake", "service_times", "simulate"]
