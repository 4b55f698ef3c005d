"""The simulator's rooms for rule 12's exact per-job form (lane_plugin.sim.rooms): the segment tree and the epoch
counters a ledger can keep, each against the rooms kept one by one, over random arrivals, admissions (every older
waiting job passed), parks and reads; and the simulator with the form on (SimConfig.overtake_exact) keeping a big
job within its bound, with either structure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lane_plugin.policy import LANE_DEFAULTS
from lane_plugin.sim import SimConfig, simulate
from lane_plugin.sim.rooms import EpochRooms, RoomTree
from tests.sim.test_tenants import _big_amid_small

_OPS = st.lists(
    st.tuples(st.sampled_from(["arrive", "admit", "park", "read"]), st.integers(0, 10**6), st.integers(0, 10**6)),
    max_size=200,
)
_MANY = st.lists(  # arrivals twice as likely: epochs fill
    st.tuples(
        st.sampled_from(["arrive", "arrive", "admit", "park", "read"]), st.integers(0, 10**6), st.integers(0, 10**6)
    ),
    min_size=20,
    max_size=200,
)


def _check(rooms_of, ops, size) -> None:
    """Run ``ops`` on ``rooms_of(size)`` and on rooms kept one by one; every read, and the whole queue's, agree."""
    tree, rooms = rooms_of(size), {}
    arrived = 0
    for op, a, b in ops:
        waiting = sorted(rooms)
        if op == "arrive":  # past the capacity: the tree grows
            tree.set(arrived, a)
            rooms[arrived] = a
            arrived += 1
        elif op in ("admit", "park") and waiting:
            p = waiting[a % len(waiting)]
            del rooms[p]
            tree.clear(p)
            if op == "admit":
                tree.lower(p, b)
                for q in rooms:
                    if q < p:
                        rooms[q] -= b
        span = tuple(sorted((a % (arrived + 2), b % (arrived + 2))))
        for lo, hi in (span, (0, arrived + 1)):  # a range, and the whole queue (as policies.py reads it)
            want = [r for q, r in rooms.items() if lo <= q < hi]
            assert tree.least(lo, hi) == (min(want) if want else None)
    assert all(tree.room(q) == r for q, r in rooms.items())


@settings(max_examples=60, deadline=None)
@given(ops=_OPS, capacity=st.integers(1, 40))
def test_the_tree_s_least_room_over_any_range_is_what_each_job_was_left(ops, capacity):
    _check(lambda n: RoomTree(lambda jid: None, n), ops, capacity)


@settings(max_examples=100, deadline=None)
@given(ops=_MANY, size=st.integers(2, 6))
def test_the_epochs_keep_the_same_rooms(ops, size):
    """Small epochs and many arrivals: whole epochs (read by their head, stale entries under it), epochs read in
    part, epochs emptied and dropped, a pass from inside its own epoch."""
    _check(lambda n: EpochRooms(lambda jid: None, n), ops, size)


@pytest.mark.parametrize("epoch", [None, 4])
def test_the_simulator_charges_each_job_its_own_passes_and_keeps_the_big_job_within_its_bound(epoch):
    """As tests/sim/test_tenants.py's budget test, with the exact per-job form: the big job found 20k waiting, so at
    most 5k of later jobs pass it and it waits within (1 + beta) x token-fifo's wait plus two windows."""
    cfg = dict(ceiling=10**9, allowance=10**9, burst_tokens=20_000, window_seconds=10.0, max_leased=64, workers=64)
    cfg.update(service_base=1.0, service_per_token=0.0, max_wait_seconds=600.0)
    tr = _big_amid_small()
    big = tr.est.index(9_000)
    (lane, fifo), (held,) = (
        simulate(
            tr,
            SimConfig(**cfg, overtake_slack=None, overtake_beta=0.25, overtake_epoch=epoch),
            ["lane", "token-fifo"],
        ),
        simulate(tr, SimConfig(**cfg, overtake_slack=None), ["lane"]),
    )
    assert held.waits[big] > 100.0  # the order alone holds it behind the small jobs
    assert lane.waits[big] <= 1.25 * fifo.waits[big] + 2 * 10.0 + 1.0
    assert (lane.never_admitted, lane.stalled, lane.parked) == (0, False, 0)  # nothing left behind by the rooms


def test_the_simulator_runs_rule_12_as_the_ledger_does():
    """The lane's default slack (off), charged per job when on (the ledger's form), on its second day; a day that is
    none of the three is refused by name."""
    cfg = SimConfig()
    assert (cfg.overtake_slack, cfg.overtake_exact, cfg.overtake_day) == (LANE_DEFAULTS["overtake_slack"], True, 2)
    with pytest.raises(ValueError, match="overtake_day=3 must be 0"):
        SimConfig(overtake_day=3)


@pytest.mark.parametrize("epoch", [0, -3, 2.5, True, "64"])
def test_epochs_need_a_whole_positive_size(epoch):
    with pytest.raises(ValueError, match=f"overtake_epoch={epoch!r} must be a whole number >= 1"):
        SimConfig(overtake_slack=None, overtake_beta=0.25, overtake_epoch=epoch)


def test_epochs_need_the_exact_form():
    with pytest.raises(ValueError, match="overtake_epoch=4 needs overtake_exact=True"):
        SimConfig(overtake_slack=None, overtake_beta=0.25, overtake_exact=False, overtake_epoch=4)
