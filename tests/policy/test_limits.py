"""Rule 6b (a sliding window per limit) and rule 1b (the provider's pause), property-tested: pure, no database."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lane_plugin.policy import Candidate, LanePolicy, LaneSnapshot, admit, never_fits
from lane_plugin.policy.limits import (
    EXTRA_UNITS,
    MAX_AMOUNT,
    MAX_WINDOW,
    MIN_WINDOW,
    NO_TOKENS_LIMIT,
    Limit,
    LimitSyntaxError,
    LimitUse,
    limit_problem,
    limits_of_spec,
    parse_limit,
    spec_of,
)
from lane_plugin.policy.rules import LIMIT_PREFIX, PAUSED
from lane_plugin.testing import max_in_window

jobs = st.lists(
    st.tuples(st.integers(1, 60), st.integers(0, 40), st.integers(0, 40), st.floats(0.0, 30.0)),
    min_size=1,
    max_size=40,
)
limit_sets = st.fixed_dictionaries(
    {},
    optional={
        "requests": st.tuples(st.integers(1, 6), st.sampled_from([1.0, 2.5, 5.0])),
        "input_tokens": st.tuples(st.integers(40, 150), st.sampled_from([1.0, 3.0])),
        "output_tokens": st.tuples(st.integers(40, 150), st.sampled_from([2.0, 4.0])),
    },
)


def _run(policy: LanePolicy, arrivals, step: float = 0.25):
    """Drive admit on a clock as the ledger does (each window the units admitted in (now - w, now]); jobs settle
    at once. Returns the admissions as ``(t, units)`` and the jobs never admitted."""
    waiting = []
    admitted: list[tuple[float, dict]] = []
    pending = sorted(arrivals, key=lambda a: a[3])
    t = 0.0
    while (pending or waiting) and t < 200:
        while pending and pending[0][3] <= t:
            est, i, o, at = pending.pop(0)
            c = Candidate(f"j{len(admitted)}-{at}-{len(waiting)}-{est}", est, at, input_cost=i, output_cost=o)
            if never_fits(policy, c.est, input_cost=i, output_cost=o) is None:
                waiting.append(c)
        uses = tuple(
            LimitUse(u, lim, sum(units[u] for at, units in admitted if at > t - lim.window_seconds))
            for u, lim in policy.limits
        )
        tokens_used = sum(units["tokens"] for at, units in admitted if at > t - policy.window_seconds)
        snap = LaneSnapshot(policy, spent=0, reserved=0, leased=0, window_used=tokens_used, now=t, limits=uses)
        d = admit(snap, waiting)
        for c in d.admitted:
            admitted.append((t, c.units))
            waiting.remove(c)
        t += step
    return admitted, waiting


@settings(max_examples=150, deadline=None)
@given(jobs, limit_sets)
def test_no_span_of_a_limits_window_ever_holds_more_than_its_amount(arrivals, lims):
    limits = tuple((u, Limit(*lims[u])) for u in EXTRA_UNITS if u in lims)
    policy = LanePolicy(ceiling=10**9, burst_tokens=90, window_seconds=2.0, max_leased=10**6, limits=limits)
    admitted, waiting = _run(policy, arrivals)
    for unit, lim in policy.all_limits:
        peak, _ = max_in_window([(t, units[unit]) for t, units in admitted], lim.window_seconds)
        assert peak <= lim.amount, (unit, peak, lim)
    assert not waiting  # every job that passed intake was admitted: the windows slide, nothing starves


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 200), st.integers(0, 200), st.integers(0, 200), st.integers(1, 150), st.integers(1, 150))
def test_intake_refuses_exactly_the_jobs_whose_units_exceed_a_limit(est, i, o, in_amount, out_amount):
    limits = (("input_tokens", Limit(in_amount, 1.0)), ("output_tokens", Limit(out_amount, 1.0)))
    policy = LanePolicy(ceiling=10**9, burst_tokens=NO_TOKENS_LIMIT, limits=limits)
    why = never_fits(policy, est, input_cost=i, output_cost=o)
    assert (why is None) == (i <= in_amount and o <= out_amount)
    if why is not None:
        assert "exceeds the limit" in why
    # and admission, given one in an empty lane (a limit lowered since intake), never leases it: it is parked
    d = admit(
        LaneSnapshot(policy, 0, 0, 0, 0, 0.0, limits=tuple(LimitUse(u, lim) for u, lim in limits)),
        [Candidate("a", est, 0.0, input_cost=i, output_cost=o)],
    )
    assert (d.ids == ["a"]) == (why is None)
    if why is not None:
        assert [(c.id, rule) for c, rule, _ in d.parked][0][1].startswith(LIMIT_PREFIX)


def test_an_unknown_split_counts_the_whole_rate_cost_against_both_token_limits():
    policy = LanePolicy(ceiling=10**9, limits=(("output_tokens", Limit(100, 1.0)),))
    assert never_fits(policy, 150) == "output_tokens 150 exceeds the limit output_tokens 100/1s"
    assert never_fits(policy, 150, input_cost=100, output_cost=50) is None


def test_a_full_limit_names_its_unit_and_the_shadow_keeps_its_room():
    policy = LanePolicy(ceiling=10**9, max_leased=100, limits=(("requests", Limit(2, 10.0)),))
    snap = LaneSnapshot(policy, 0, 0, 0, 0, 0.0, limits=(LimitUse("requests", Limit(2, 10.0), used=1),))
    d = admit(snap, [Candidate("a", 5, 0.0), Candidate("b", 6, 0.0)])
    assert d.ids == ["a"] and d.head_reason == "limit:requests" and d.limit_need == (("requests", 1),)


@settings(max_examples=50, deadline=None)
@given(st.floats(0.0, 100.0), st.floats(0.001, 50.0))
def test_nothing_is_admitted_into_a_paused_lane_and_everything_fits_once_it_reopens(now, left):
    policy = LanePolicy(ceiling=10**9)
    cands = [Candidate("a", 10, 0.0)]
    assert admit(LaneSnapshot(policy, 0, 0, 0, 0, now, paused_until=now + left), cands).head_reason == PAUSED
    assert admit(LaneSnapshot(policy, 0, 0, 0, 0, now + left, paused_until=now + left), cands).ids == ["a"]


@pytest.mark.parametrize(
    "text, unit, amount, window",
    [
        ("requests=500/60s", "requests", 500, 60.0),
        ("tokens=30_000/1m", "tokens", 30000, 60.0),
        ("output_tokens=8000/m", "output_tokens", 8000, 60.0),
        ("input_tokens=10/250ms", "input_tokens", 10, 0.25),
        ("requests = 5 / 2h", "requests", 5, 7200.0),
    ],
)
def test_limit_syntax(text, unit, amount, window):
    assert parse_limit(text) == (unit, Limit(amount, window))


@pytest.mark.parametrize(
    "text, needle",
    [
        ("requests=500", "expected AMOUNT/WINDOW"),
        ("requests", "expected UNIT=AMOUNT/WINDOW"),
        ("rpm=5/1s", "unknown unit 'rpm'"),
        ("requests=0/1s", "positive integer"),
        ("requests=5/0s", "longer than 0"),
        ("requests=-5/1s", "positive integer, got -5"),
        ("requests=5/1y", "the window '1y' is not a number"),
        ("requests=5.5/1s", "the amount '5.5' is not a whole number"),
        ("requests=5/nans", "the window 'nans'"),
        ("requests=/60s", "expected AMOUNT/WINDOW"),
        ("requests=5/", "expected AMOUNT/WINDOW"),
        # not ASCII digits
        ("requests=\u0661\u0662/60s", "not a whole number"),
        ("requests=5/\u0666\u0660s", "the window"),
        # bounds as the lane's own settings have them: a stored spec must read back, and fit a BIGINT
        ("requests=99999999999999999999999/60s", "at most 1,000,000,000,000"),
        ("tokens=1000000000001/60s", "at most 1,000,000,000,000"),
        ("requests=5/99999999999999999999s", "from 1ms to a year"),
        ("requests=5/0.00001s", "from 1ms to a year"),
        ("requests=5/1e400s", "from 1ms to a year"),
        ("requests=5/366d", "from 1ms to a year"),
    ],
)
def test_bad_limit_syntax_names_the_value(text, needle):
    with pytest.raises(LimitSyntaxError, match=needle) as err:
        parse_limit(text)
    assert repr(text) in str(err.value)
    assert err.value.spec == text and str(err.value) == f"limit {text!r}: {err.value.why}"


@pytest.mark.parametrize(
    "lim, needle",
    [
        (Limit(5.5, 60.0), "whole number"),
        (Limit(True, 60.0), "whole number"),
        (Limit(0, 60.0), "positive"),
        (Limit(10**13, 60.0), "at most"),
        (Limit(5, float("nan")), "number of seconds"),
        (Limit(5, "60"), "number"),
        (Limit(5, float("inf")), "a year"),
        (Limit(5, 0.0), "longer than 0"),
        (Limit(5, 1e-4), "from 1ms"),
    ],
)
def test_a_limit_out_of_bounds_is_named(lim, needle):
    assert needle in limit_problem(lim)


def test_the_bounds_themselves_are_limits():
    assert parse_limit("requests=1000000000000/1ms") == ("requests", Limit(MAX_AMOUNT, MIN_WINDOW))
    assert parse_limit("requests=1/365d") == ("requests", Limit(1, MAX_WINDOW))
    assert parse_limit("requests=5/1e3s") == ("requests", Limit(5, 1000.0))  # as a stored spec may say


@given(
    st.dictionaries(
        st.sampled_from(EXTRA_UNITS), st.tuples(st.integers(1, MAX_AMOUNT), st.floats(MIN_WINDOW, MAX_WINDOW))
    )
)
def test_the_stored_spec_reads_back_as_it_was_written(lims):
    limits = [(u, Limit(a, w)) for u, (a, w) in lims.items()]
    assert dict(limits_of_spec(spec_of(limits))) == dict(limits)
