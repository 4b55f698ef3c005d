"""The simulator as an honest instrument (issue 11, item 4), on traces worked out by hand.

Chained runs, the sliding burst window every policy obeys, service time that
follows output tokens, the rollover tick, the drain, and the new figures.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lane_plugin.sim.config import SimConfig
from lane_plugin.sim.engine import simulate
from lane_plugin.sim.meter import OverBurst
from lane_plugin.sim.policies import POLICIES
from lane_plugin.sim.traffic import Trace
from lane_plugin.sim.window import RateWindow

BASELINES = ("count", "token-fifo", "smallest-first")
ROOMY = dict(
    ceiling=10**9,
    allowance=10**9,
    start_fraction=1.0,
    burst_tokens=10**6,
    max_leased=50,
    workers=50,
    lease_seconds=10**6,
    service_per_token=0.0,
)


def trace(*jobs, **columns) -> Trace:
    """jobs: (arrival, est[, actual[, run_key]]); keyword lists give rate_cost/output_tokens per job."""
    tr = Trace()
    for i, job in enumerate(jobs):
        arrival, est, *rest = job
        actual = rest[0] if rest else est
        run_key = rest[1] if len(rest) > 1 else None
        tr.add(arrival, "s", est, actual, run_key, **{k: v[i] for k, v in columns.items()})
    return tr.sort()


def events(result, kind: str) -> list[tuple]:
    return [e for e in result.log if e[0] == kind]


def admitted(result) -> list[tuple[float, str]]:
    return [(e[1], jid) for e in events(result, "tick") for jid in e[2]]


# -- chained runs -----------------------------------------------------------------
@pytest.mark.parametrize("policy", list(POLICIES))
def test_stage_k_plus_1_is_submitted_when_stage_k_settles(policy):
    # Run r: three stages recorded at 0, 1, 2 (all at once, as a generator would
    # write them); each takes 10 s. Chained, stage 2 arrives at 10 and stage 3 at 20.
    tr = trace((0, 100, 100, "r"), (1, 100, 100, "r"), (2, 100, 100, "r"), (5, 50))
    (res,) = simulate(tr, SimConfig(**{**ROOMY, "service_base": 10.0}), [policy], record=True)
    submits = [(e[1], e[2]) for e in events(res, "submit")]
    assert submits == [(0.0, "j0000000"), (5.0, "j0000003"), (10.0, "j0000001"), (20.0, "j0000002")]
    assert [e[1] for e in events(res, "settle") if e[2] != "j0000003"] == [10.0, 20.0, 30.0]
    assert res.waits == [0.0, 0.0, 0.0, 0.0]  # a stage waits from its own submission, not the run's
    assert (res.runs, res.runs_started, res.runs_finished, res.stranded_tokens) == (2, 2, 2, 0)


def test_unchained_replays_recorded_arrivals():
    tr = trace((0, 100, 100, "r"), (1, 100, 100, "r"))
    (res,) = simulate(tr, SimConfig(**{**ROOMY, "service_base": 10.0, "chain": False}), ["lane"], record=True)
    assert [e[1] for e in events(res, "submit")] == [0.0, 1.0]


def test_a_parked_stage_breaks_its_run_and_strands_what_it_settled():
    # One lease at a time, 10 s per job, deadline 15 s. Run a: 100 then 200;
    # run b: 300 at t=1. a1 runs 0-10, then a2 (submitted at 10) competes with
    # b1 (waiting since 1): smallest first, a2 runs 10-20; b1 has waited 19 s
    # by then and is parked at t=16. Run c: c1 parked too, so c2 is never submitted.
    tr = trace((0, 100, 100, "a"), (0, 200, 200, "a"), (1, 300, 300, "b"), (2, 400, 400, "c"), (2, 50, 50, "c"))
    cfg = SimConfig(
        **{**ROOMY, "max_leased": 1, "workers": 1, "service_base": 10.0, "deadline": 15.0, "max_wait_seconds": 10**6}
    )
    (res,) = simulate(tr, cfg, ["lane"], record=True)
    assert [e[2] for e in events(res, "park")] == ["j0000002", "j0000003"]
    assert [e[1] for e in events(res, "park")] == [16.0, 17.0]
    assert (res.runs, res.runs_started, res.runs_finished) == (3, 1, 1)
    assert (res.parked, res.not_submitted, res.stranded_tokens) == (2, 1, 0)
    assert res.parked_wait_p50 == pytest.approx(15.0) and res.parked_wait_p99 == pytest.approx(15.0)


def test_stranded_tokens_are_settled_stages_of_runs_that_did_not_finish():
    # Budget 250 and no reset: run r's first stage (200) settles, its second (100) never fits.
    tr = trace((0, 200, 200, "r"), (0, 100, 100, "r"), (0, 40, 40, "s"))
    cfg = SimConfig(**{**ROOMY, "ceiling": 250, "allowance": 300, "service_base": 1.0})
    (fifo,) = simulate(tr, cfg, ["token-fifo"])
    assert (fifo.runs_started, fifo.runs_finished, fifo.stranded_tokens) == (2, 1, 200)
    assert fifo.never_admitted == 1 and fifo.stalled


# -- the sliding burst window -------------------------------------------------------
def sliding_max(admissions: list[tuple[float, int]], window: float) -> int:
    """Most tokens admitted within any span (t - window, t], recomputed from the log."""
    worst = 0
    for t, _ in admissions:
        worst = max(worst, sum(n for s, n in admissions if s <= t < s + window))
    return worst


@pytest.mark.parametrize("policy", BASELINES)
def test_every_baseline_obeys_the_sliding_window_and_wakes_when_it_frees(policy):
    # burst 1000 per 10 s. 600 at t=9.5 and 600 at t=10.5: a fixed window
    # (reset at 10) would let both through 1 s apart. Sliding, the second waits
    # until the first leaves the window at 19.5 - with no other event to wake it.
    tr = trace((9.5, 600), (10.5, 600))
    cfg = SimConfig(**{**ROOMY, "burst_tokens": 1_000, "window_seconds": 10.0, "service_base": 1.0})
    (res,) = simulate(tr, cfg, [policy], record=True)
    assert admitted(res) == [(9.5, "j0000000"), (19.5, "j0000001")]
    assert res.over_burst == 0 and res.waits == [0.0, 9.0]


@pytest.mark.parametrize("policy", BASELINES)
def test_the_window_counts_rate_cost_not_est(policy):
    # est 100 each, but each request charges 700 rate tokens (prompt + max_tokens): one per window.
    tr = trace((0, 100), (0, 100), rate_cost=[700, 700])
    cfg = SimConfig(**{**ROOMY, "burst_tokens": 1_000, "window_seconds": 60.0, "service_base": 1.0})
    (res,) = simulate(tr, cfg, [policy], record=True)
    assert [t for t, _ in admitted(res)] == [0.0, 60.0]


def test_a_rate_cost_above_the_burst_is_refused_at_intake_for_every_policy():
    tr = trace((0, 100), (1, 100), rate_cost=[5_000, 500])
    cfg = SimConfig(**{**ROOMY, "burst_tokens": 1_000, "service_base": 1.0})
    for res in simulate(tr, cfg):
        assert (res.jobs, res.refused, res.done) == (1, 1, 1), res.policy


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 50, allow_nan=False), st.integers(1, 400), st.integers(1, 400)), min_size=1, max_size=40
    ),
    st.sampled_from([1.0, 7.0, 30.0]),
)
def test_over_burst_is_what_a_sliding_limit_would_refuse(jobs, window):
    # Every baseline stays within burst in every sliding span (over_burst 0);
    # whatever `lane` does, its over_burst equals a recount from its own log.
    tr = trace(*[(t, e) for t, e, _ in jobs], rate_cost=[r for _, _, r in jobs])
    cfg = SimConfig(**{**ROOMY, "burst_tokens": 500, "window_seconds": window, "service_base": 0.5})
    for res in simulate(tr, cfg, record=True):
        rate = {f"j{j:07d}": tr.rate_costs()[j] for j in range(len(tr))}
        log = [(t, rate[jid]) for t, jid in admitted(res)]
        meter = OverBurst(500, window)
        for t, n in log:
            meter.charge(t, n)
        assert res.over_burst == meter.over, res.policy
        if res.policy in BASELINES:
            assert res.over_burst == 0 and sliding_max(log, window) <= 500, res.policy


def test_sliding_window_unit():
    w = RateWindow(10.0)
    w.charge(0.0, 300)
    w.charge(4.0, 500)
    assert (w.used(9.99), w.free_at(9.99, 1_000 - 600)) == (800, 14.0)  # room for 600: when the 500 leaves
    assert w.free_at(9.99, 1_000 - 400) == 10.0  # room for 400: when the 300 leaves
    assert w.used(10.0) == 500  # (0, 10]: the charge at 0 has left
    assert w.used(14.0) == 0 and w.free_at(14.0, 0) == 14.0
    assert w.free_at(14.0, -1) is None  # more than the burst: never
    none = RateWindow(0.0)  # no window: nothing counted
    assert none.charge(3.0, 10) is None and none.used(3.0) == 0
    meter = OverBurst(100, 0.0)
    meter.charge(0.0, 1_000)
    assert meter.over == 0


def test_a_blocked_job_wakes_when_enough_room_frees_not_at_the_first_expiry():
    # burst 1000 / 10 s: 100 at 0, 800 at 1; a 900 at 2 fits only once the 800 has left (t=11),
    # not when the 100 leaves (t=10).
    tr = trace((0, 100), (1, 800), (2, 900))
    cfg = SimConfig(**{**ROOMY, "burst_tokens": 1_000, "window_seconds": 10.0, "service_base": 0.5})
    (res,) = simulate(tr, cfg, ["token-fifo"], record=True)
    assert admitted(res)[-1] == (11.0, "j0000002")
    assert [e[1] for e in events(res, "tick")] == [0.0, 1.0, 2.0, 11.0]  # no futile tick at 10


# -- the worker ---------------------------------------------------------------------
def test_service_time_follows_output_tokens_where_known():
    # A 9,000-token prompt with 10 output tokens is quick; a 100-token prompt
    # with 500 output tokens is slow (0.02 s per output token).
    tr = trace((0, 9_256, 9_010), (0, 356, 600), (1, 300), output_tokens=[10, 500, None])
    cfg = SimConfig(**{**ROOMY, "service_base": 1.0, "service_per_output_token": 0.02, "service_per_token": 0.001})
    (res,) = simulate(tr, cfg, ["count"], record=True)
    settles = {e[2]: e[1] for e in events(res, "settle")}
    assert settles == {
        "j0000000": pytest.approx(1.2),
        "j0000001": pytest.approx(11.0),
        "j0000002": pytest.approx(1 + 1 + 0.3),
    }


# -- clock: rollover ticks and the drain ---------------------------------------------
@pytest.mark.parametrize("policy", ["token-fifo", "smallest-first", "lane"])
def test_a_period_rollover_ticks_with_no_other_event(policy):
    # Ceiling 500 a day: the second 300 does not fit on day one and nothing else
    # happens until midnight: the rollover tick admits it at exactly 86,400.
    tr = trace((0, 300), (1, 300))
    cfg = SimConfig(**{**ROOMY, "ceiling": 500, "allowance": 600, "period_seconds": 86_400.0, "service_base": 1.0})
    (res,) = simulate(tr, cfg, [policy], record=True)
    assert admitted(res) == [(0.0, "j0000000"), (86_400.0, "j0000001")]
    assert (res.done, res.over_ceiling, res.periods, res.end_s) == (2, 0, 1, 86_401.0)
    assert res.budget_used == pytest.approx(300 / 500)  # day 2 only drains: not counted


def test_the_default_horizon_runs_until_drained_and_a_horizon_censors():
    # One slot, 100 s per job, ten jobs at t=0..9: the drain ends at 1,000.
    tr = trace(*[(i, 100) for i in range(10)])
    cfg = dict(ROOMY, max_leased=1, workers=1, service_base=100.0)
    (drained,) = simulate(tr, SimConfig(**cfg), ["count"])
    assert (drained.done, drained.end_s, drained.never_admitted, drained.stalled) == (10, 1_000.0, 0, False)
    assert drained.wait_p99 == pytest.approx(891.0)  # the last job: submitted at 9, started at 900
    assert drained.busy_pct == pytest.approx(100.0)
    (cut,) = simulate(tr, SimConfig(**cfg, horizon=250.0), ["count"])
    assert (cut.done, cut.end_s) == (2, 250.0)
    assert cut.never_admitted == 7  # the third is leased (admitted) at 200 and running
    assert cut.never_admitted_wait_p99 == pytest.approx(247.0)  # submitted at 3, still waiting at 250


def test_a_rollover_on_an_idle_lane_that_admits_nothing_ends_the_drain(monkeypatch):
    # A policy that never admits: with a daily reset the clock would tick through
    # empty days for ever. The first rollover that finds nothing leased, nothing
    # pending and nothing admitted stops it, and the waiting job is shown.
    monkeypatch.setitem(POLICIES, "never", lambda sim, now: ([], 0))
    tr = trace((5, 100))
    cfg = SimConfig(**{**ROOMY, "period_seconds": 86_400.0})
    (res,) = simulate(tr, cfg, ["never"])
    assert res.stalled and res.never_admitted == 1 and res.end_s == 86_400.0 - 5
    assert res.never_admitted_wait_p50 == 86_395.0 and res.wait_p50 != res.wait_p50  # NaN: nobody served


def test_without_a_reset_jobs_left_waiting_are_stalled_not_dropped():
    # Ceiling 250, no period: the third job never fits; the clock stops at the last event.
    # The job shows as never admitted (with its wait until then), or as parked where the
    # policy parks what cannot fit before a reset: never dropped from the figures.
    tr = trace((0, 100), (1, 100), (2, 100))
    cfg = SimConfig(**{**ROOMY, "ceiling": 250, "allowance": 250, "service_base": 1.0})
    for res in simulate(tr, cfg, ["token-fifo", "smallest-first", "lane"]):
        assert (res.done, res.never_admitted + res.parked) == (2, 1), res.policy
        assert res.stalled == (res.never_admitted == 1), res.policy
        if res.stalled:
            assert res.never_admitted_wait_p50 == pytest.approx(res.end_s - 2), res.policy


def test_budget_used_counts_the_periods_traffic_arrived_in():
    # Day 0: 400 of 500 spent; day 1: nothing arrives; day 2: 500 of 500.
    tr = trace((0, 400), (2 * 86_400 + 5, 300), (2 * 86_400 + 6, 200))
    cfg = SimConfig(**{**ROOMY, "ceiling": 500, "allowance": 500, "period_seconds": 86_400.0, "service_base": 1.0})
    (res,) = simulate(tr, cfg, ["token-fifo"])
    assert (res.periods, res.spent) == (2, 900)
    assert res.budget_used == pytest.approx(900 / 1_000)
