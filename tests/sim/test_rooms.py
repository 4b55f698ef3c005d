"""The simulator's rooms for rule 12's exact per-job form (lane_plugin.sim.rooms): the segment tree against the
rooms kept one by one, over random arrivals, admissions (every older waiting job passed), parks and reads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lane_plugin.sim.rooms import RoomTree

_OPS = st.lists(
    st.tuples(st.sampled_from(["arrive", "admit", "park", "read"]), st.integers(0, 10**6), st.integers(0, 10**6)),
    max_size=200,
)


@settings(max_examples=60, deadline=None)
@given(ops=_OPS, capacity=st.integers(1, 40))
def test_the_least_room_over_any_range_is_what_each_job_was_left(ops, capacity):
    tree, rooms = RoomTree(lambda jid: None, capacity), {}
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
        lo, hi = sorted((a % (arrived + 2), b % (arrived + 2)))
        want = [r for q, r in rooms.items() if lo <= q < hi]
        assert tree.least(lo, hi) == (min(want) if want else None)
    assert all(tree.room(q) == r for q, r in rooms.items())
