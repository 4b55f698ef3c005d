"""Rule 12's exact per-job form (lane_plugin.policy.perjob): each job's own count of what passed it, against its key.

The rate-bound lane of tests/policy/test_overtake.py (random arrivals of small and big jobs, three tenants of random
weights, :func:`admit` every second), the store keeping each waiting job's room (``key - O``) one by one. Checked,
as the module's docstring says: no job ever has more than ``V_J + key_J`` rate tokens admitted ahead of it, with
the pointwise keys and with the quantile form's, and so with the two heads read per job (each row of the key index
with its due); and the per-job count lets through a pass the two lane-wide
heads refuse (a younger peak arrival whose key is small, which the pass does not pass).
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from lane_plugin.policy import Candidate, LanePolicy, LaneSnapshot, admit
from lane_plugin.policy.overtake import Overtaking, overtake_key
from lane_plugin.policy.perjob import ExactBudget
from lane_plugin.policy.slack import slack_key
from tests.policy.test_overtake import _jobs, _Rooms, _run
from tests.policy.test_slack import _keyer, _nearest_rank

BURST = 20_000


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32), beta=st.sampled_from([0.0, 0.1, 0.25, 0.5]), load=st.floats(0.6, 1.6))
def test_no_job_is_passed_by_more_than_its_own_pointwise_key(seed, beta, load):
    jobs = _jobs(random.Random(seed), BURST, 150, load)
    own: dict = {}
    v, _ = _run(jobs, BURST, beta, seed, exact=True, own=own)
    # Within its tenant: what its tenant had waiting when it arrived, plus its key (from the lane's V).
    late = {j: (own[j], v[j]) for j in v if own[j][1] > own[j][0] + overtake_key(v[j], beta)}
    assert late == {}


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    slack=st.sampled_from([1.0, 1.1, 1.3, 2.0]),
    load=st.floats(0.6, 1.6),
    warmup=st.integers(0, 60),
)
def test_the_quantile_bound_holds_with_each_job_charged_its_own_passes(seed, slack, load, warmup):
    jobs = _jobs(random.Random(seed), BURST, 150, load)
    keyer, estimates = _keyer(slack, 0.9, warmup)
    own: dict = {}
    v, _ = _run(jobs, BURST, None, seed, keyer=keyer, exact=True, own=own)
    ids = sorted(v)
    q_at = dict(zip(ids, estimates))
    # Within its tenant: its tenant's V (at most the lane's) plus its key.
    late = {j: (own[j], v[j], q_at[j]) for j in ids if own[j][1] > slack_key(v[j], q_at[j], slack) + own[j][0]}
    assert late == {}
    p = _nearest_rank(list(v.values()), 0.9)
    assert _nearest_rank([own[j][1] for j in ids], 0.9) <= slack * max(p, max(estimates))


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    slack=st.sampled_from([1.0, 1.1, 1.3, 2.0]),
    load=st.floats(0.6, 1.6),
    reads=st.integers(1, 8),
    warmup=st.integers(0, 60),
)
def test_the_quantile_bound_holds_with_each_job_within_either_of_its_two_allowances(seed, slack, load, reads, warmup):
    """The heads read per job (Overtaking's guard_dues): a pass is allowed while every waiting job keeps O <= key by
    its key against ``passed`` or by its due against ``left``, however few of the key index's rows are read."""
    jobs = _jobs(random.Random(seed), BURST, 150, load)
    keyer, estimates = _keyer(slack, 0.9, warmup)
    v, ahead = _run(jobs, BURST, None, seed, guard_reads=reads, keyer=keyer, dues=True, either=True)
    ids = sorted(v)
    q_at = dict(zip(ids, estimates))
    late = {j: (ahead[j], v[j], q_at[j]) for j in ids if ahead[j] > slack_key(v[j], q_at[j], slack) + v[j]}
    assert late == {}


def test_a_pass_the_job_it_passes_has_room_for_goes_though_the_least_key_is_shorter():
    """An old job o with room to spare, a peak arrival k with a small key, and a candidate y between them: y passes
    only o, which has room for it, but the least key (k's) refuses it under the heads; per job it goes."""
    p = LanePolicy(ceiling=10**9, burst_tokens=10_000, window_seconds=10.0)
    # positions: 0 = o (old, big room left 900), 1 = y (the candidate), 2 = k (peak arrival, room 50)
    rooms = _Rooms()
    rooms.room = {0: 900, 1: 5_000, 2: 50}
    o, y, k = Candidate("j00000", 9_000, 0.0), Candidate("j00001", 400, 1.0), Candidate("j00002", 9_000, 2.0)
    heads = dict(passed=0, guard=((50, "j00002"), (900, "j00000"), (5_000, "j00001")), oldest=("j00000",))
    snap = LaneSnapshot(p, 0, 0, 0, window_used=9_500, now=3.0, **heads)
    assert admit(snap, [y, o, k]).ids == []  # the least key (k's 50) refuses y's 400, though y does not pass k
    snap = LaneSnapshot(p, 0, 0, 0, window_used=9_500, now=3.0, **heads, rooms=rooms)
    d = admit(snap, [y, o, k])
    assert d.ids == ["j00001"] and d.overtook == 400  # per job: y passes o only, whose room (900) holds it
    assert not ExactBudget(rooms).allows(Candidate("j00003", 60, 4.0))  # a later job passes k too: 50 < 60


def test_an_old_job_within_its_key_and_a_peak_arrival_within_its_due_let_a_pass_neither_head_allows():
    """The diagnosis's case: the oldest job o has passed (150) well within its key (5,000) but its due nearly
    used; the peak arrival k has a small key (200) and most of its due left. A pass of 100 keeps each within one
    of its own allowances; lane-wide, the least key (200 < 250) and the least due (10,050 < 10,100) both refuse."""
    guard, dues = ((200, "k"), (5_000, "o")), ((10_050, "o"), (10_500, "k"))
    y = Candidate("y", 100, 1.0)
    lane_wide = Overtaking(150, guard, ("o", "y", "k"), since=10_000, dues=dues)
    per_job = Overtaking(150, guard, ("o", "y", "k"), since=10_000, dues=dues, guard_dues=(10_500, 10_050))
    assert not lane_wide.allows(y) and per_job.allows(y)
    assert not per_job.allows(Candidate("z", 600, 2.0))  # k: 150 + 600 > 200 and 10,600 > 10,500
