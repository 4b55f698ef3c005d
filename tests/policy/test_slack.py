"""Rule 12's quantile form (lane_plugin.policy.slack): the lane's quantile of tokens ahead against token-fifo's.

The same rate-bound lane as tests/policy/test_overtake.py (:func:`admit` every second, random arrivals of small
and big jobs in three tenants of random weights), each job keyed at arrival by :func:`slack_key` from V and the
running quantile of V before it. Checked, as the module's docstring proves: every job has at most ``max(c V_J,
c Q_J)`` rate tokens admitted ahead of it, and for every ``x`` the jobs with more than ``c x`` ahead are at most
those with ``V_J > x`` plus those whose estimate exceeded ``x``; so with the estimate at most the run's q-quantile
of V, the lane's q-quantile of tokens ahead is within ``c`` of token-fifo's. With and without the second bound
(``since`` and ``dues``: what left the queue since each job arrived).
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lane_plugin.policy.slack import BUCKETS_PER_DOUBLING, BacklogQuantile, slack_key
from tests.policy.test_overtake import _jobs, _run

BURST = 20_000


def _keyer(slack: float, q: float, warmup: int):
    """A job's key from V at its arrival, as the lane keeps it; ``estimates`` records the estimate each read."""
    backlog = BacklogQuantile(q, warmup=warmup)
    estimates: list[int] = []

    def key(v: int) -> int:
        est = backlog.value()
        estimates.append(est)
        backlog.add(v)
        return slack_key(v, est, slack)

    return key, estimates


def _nearest_rank(values, q: float) -> int:
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    slack=st.sampled_from([1.0, 1.1, 1.3, 2.0]),
    load=st.floats(0.6, 1.6),
    reads=st.integers(1, 8),
    warmup=st.integers(0, 60),
    dues=st.booleans(),
)
def test_tokens_ahead_of_every_job_are_within_the_slack_of_v_or_of_the_estimate(seed, slack, load, reads, warmup, dues):
    jobs = _jobs(random.Random(seed), BURST, 150, load)
    keyer, estimates = _keyer(slack, 0.9, warmup)
    v, ahead = _run(jobs, BURST, None, seed, guard_reads=reads, keyer=keyer, dues=dues)
    ids = sorted(v)  # arrival order: the order the keyer saw them
    q_at = dict(zip(ids, estimates))
    late = {j: (ahead[j], v[j], q_at[j]) for j in ids if ahead[j] > slack_key(v[j], q_at[j], slack) + v[j]}
    assert late == {}
    assert all(ahead[j] <= max(slack * v[j], slack * q_at[j]) + 1e-9 for j in ids)
    # the quantile statement, for every threshold x the run's V give
    for x in sorted(set(v.values())):
        over = sum(ahead[j] > slack * x for j in ids)
        assert over <= sum(v[j] > x for j in ids) + sum(q_at[j] > x for j in ids), x
    # so the lane's q-quantile is within c x max(token-fifo's, the largest estimate read): c x token-fifo's when
    # the estimate never exceeded it
    p = _nearest_rank(list(v.values()), 0.9)
    assert _nearest_rank(list(ahead.values()), 0.9) <= slack * max(p, max(estimates))


def test_a_short_queue_job_waits_past_its_pointwise_bound_and_a_big_one_stays_within_the_quantile():
    """Not pointwise: a big job that found a short queue is passed by more than (c - 1) V, up to c Q; the order
    alone passes it far past that."""
    slack = 1.3
    jobs = [(t, 1_000, "b") for t in range(0, 30) for _ in range(4)]  # a peak (twice the rate) teaches the estimate
    jobs += [(90, 1_000, "b")] * 4 + [(90, 9_000, "b")] + [(90, 1_000, "b")] * 16  # drained: a short queue
    jobs += [(t, 1_000, "b") for t in range(91, 400) for _ in range(2)]  # then the rate, steady
    big = f"j{124:05d}"
    v, ahead = _run(jobs, BURST, None)
    keyer, estimates = _keyer(slack, 0.99, 20)
    v2, ahead2 = _run(jobs, BURST, None, keyer=keyer)
    q_big = estimates[124]
    keyer, estimates = _keyer(slack, 0.99, 20)
    _, ahead3 = _run(jobs, BURST, None, keyer=keyer, dues=True)  # with the second bound: still within it
    assert ahead3[big] <= slack * q_big
    assert v[big] == v2[big]
    assert q_big > v2[big]  # the estimate leaves the big job slack past its own queue
    assert ahead[big] > slack * max(v[big], q_big)  # the order alone: held by its size class past the bound
    assert int((slack - 1) * v2[big]) + v2[big] < ahead2[big] <= slack * q_big  # used, within the quantile's slack


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(0, 10**9), min_size=1, max_size=300), q=st.sampled_from([0.5, 0.9, 0.99]))
def test_the_running_estimate_is_at_most_the_quantile_and_within_a_bucket_of_it(values, q):
    b = BacklogQuantile(q, warmup=0)
    for x in values:
        b.add(x)
    true = _nearest_rank(values, q)
    assert b.value() <= true
    assert true == 0 or b.value() >= true / 2 ** (1 / BUCKETS_PER_DOUBLING) - 1
    assert BacklogQuantile(q, warmup=len(values) + 1).value() == 0 or not values  # in warm-up: 0


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: slack_key(-1, 0), "waiting_rate=-1"),
        (lambda: slack_key(0, -5), "estimate=-5"),
        (lambda: slack_key(0, 0, 0.9), "slack=0.9"),
        (lambda: BacklogQuantile(1.0), "q=1.0"),
        (lambda: BacklogQuantile(warmup=-1), "warmup=-1"),
        (lambda: BacklogQuantile().add(-3), "waiting_rate=-3"),
    ],
)
def test_bad_input_is_refused_by_name(call, field):
    with pytest.raises(ValueError, match=field):
        call()
