"""Headroom for the spread in flight (issue 12 item 3), property-tested: pure, no database."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from lane_plugin.policy import Candidate, LanePolicy, LaneSnapshot, admit, never_fits
from lane_plugin.policy.rules import HEADROOM


def snap(p, *, spent=0, reserved=0, leased=0, reserved_var=0, resets=True):
    return LaneSnapshot(p, spent, reserved, leased, 0, 1000.0, resets=resets, reserved_var=reserved_var)


def test_headroom_is_k_sigma_of_the_summed_variance():
    p = LanePolicy(ceiling=100_000, headroom_sigmas=2.0)
    assert p.headroom(0) == 0
    assert p.headroom(25 * 100**2) == 1_000  # 25 jobs of sd 100: sd of the sum 500
    assert LanePolicy(ceiling=100_000, headroom_sigmas=0.0).headroom(10**6) == 0


def test_a_job_that_fits_by_its_mean_waits_for_room_for_the_spread():
    p = LanePolicy(ceiling=10_000, burst_tokens=10_000, max_leased=10, headroom_sigmas=2.0)
    # 9,000 committed, 500 more fits the ceiling; with sd 300 in flight (var 90,000) the headroom is 600.
    d = admit(snap(p, spent=8_000, reserved=1_000, reserved_var=80_000), [Candidate("a", 500, 999.0, var=10_000)])
    assert d.ids == [] and d.head_reason == HEADROOM
    # the same job with no known spread in flight is admitted: nothing changes where no estimator knows one
    d = admit(snap(p, spent=8_000, reserved=1_000), [Candidate("a", 500, 999.0)])
    assert d.ids == ["a"] and d.var == 0


def test_admitted_variance_is_reported_for_the_lane_row():
    p = LanePolicy(ceiling=100_000, burst_tokens=100_000, max_leased=10)
    d = admit(snap(p, reserved_var=7), [Candidate("a", 100, 999.0, var=30), Candidate("b", 200, 999.0, var=12)])
    assert d.ids == ["a", "b"] and d.var == 42


def test_a_job_whose_own_spread_never_fits_is_parked_in_a_lane_without_a_period():
    p = LanePolicy(ceiling=10_000, burst_tokens=10_000, max_leased=10, headroom_sigmas=3.0)
    c = Candidate("a", 900, 999.0, var=200**2)  # 900 + 600 headroom > the 1,000 left
    d = admit(snap(p, spent=9_000, resets=False), [c])
    assert [(x.id, rule) for x, rule, _ in d.parked] == [("a", HEADROOM)]
    assert "headroom" in never_fits(p, 9_500, var=200**2)
    assert never_fits(p, 9_000, var=200**2) is None


jobs = st.lists(st.tuples(st.integers(1, 3_000), st.integers(0, 500_000), st.booleans()), min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(
    jobs=jobs,
    spent=st.integers(0, 40_000),
    reserved=st.integers(0, 20_000),
    var0=st.integers(0, 2_000_000),
    k=st.sampled_from([0.0, 1.0, 2.0, 3.0]),
    leased=st.integers(0, 10),
)
def test_what_is_admitted_always_leaves_the_headroom_of_everything_in_flight(jobs, spent, reserved, var0, k, leased):
    """After any tick: spent + reserved + admitted + k * sqrt(var in flight) <= ceiling, if anything with a spread was admitted."""
    p = LanePolicy(ceiling=50_000, burst_tokens=50_000, max_leased=40, headroom_sigmas=k)
    cands = [Candidate(f"j{i}", e, 900.0 + i, f"r{i}" if run else None, var=v) for i, (e, v, run) in enumerate(jobs)]
    s = snap(p, spent=spent, reserved=reserved, leased=leased, reserved_var=var0)
    d = admit(s, cands)
    assert d.var == sum(c.var for c in d.admitted)
    if d.admitted:
        committed = spent + reserved + d.tokens
        assert committed + p.headroom(var0 + d.var) <= p.ceiling
    # a job with no spread and no other spread in flight sees exactly the old rule (k changes nothing)
    plain = [Candidate(c.id, c.est, c.waiting_since, c.run_key) for c in cands]
    assert (
        admit(snap(p, spent=spent, reserved=reserved, leased=leased), plain).ids
        == admit(
            snap(LanePolicy(**{**p.__dict__, "headroom_sigmas": 0.0}), spent=spent, reserved=reserved, leased=leased),
            plain,
        ).ids
    )


@settings(max_examples=200, deadline=None)
@given(n=st.integers(5, 60), sd=st.integers(10, 400), k=st.sampled_from([2.0, 3.0]), seed=st.integers(0, 10**6))
def test_settled_spend_stays_under_the_ceiling_when_errors_sit_within_the_spread(n, sd, k, seed):
    """Estimates at the mean, errors bounded by the fitted sd: admission's headroom covers what settles."""
    import random

    rng = random.Random(seed)
    p = LanePolicy(ceiling=20_000, burst_tokens=20_000, max_leased=n, headroom_sigmas=k)
    cands = [Candidate(f"j{i:03d}", 300, 900.0, var=sd * sd) for i in range(n)]
    d = admit(snap(p), cands)
    # the worst case for a k-sigma bound on m jobs with errors in [-sd, +sd] is all at +sd:
    # m * sd <= k * sd * sqrt(m) needs m <= k^2; otherwise we only claim the mean-plus-spread bound
    m = len(d.admitted)
    errors = [rng.uniform(-sd, sd) for _ in range(m)]
    settled = sum(300 + e for e in errors)
    assert d.tokens + p.headroom(m * sd * sd) <= p.ceiling
    if m <= k * k:
        assert settled <= p.ceiling
    assert math.isclose(p.headroom(m * sd * sd), math.ceil(k * sd * math.sqrt(m)), abs_tol=1)
