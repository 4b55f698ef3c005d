"""A rate charge is pending until its lease is picked up (``rates``): it holds its window room until
then, counts a full window from the pick-up, and leaves when the lease ends unpicked. On both
databases (``ledger_url``). A lease handed to waiter ``w`` is another process's: this ledger's ticks
hand it on; a job with no waiter is held by whoever ticked it (its request goes out at the grant).
"""

from __future__ import annotations

import pytest

from lane_plugin.ledger import admission
from lane_plugin.ledger.waiters import ROW_KEYS


def lane(led, **kw):
    settings = dict(
        allowance=10**6,
        ceiling=10**6,
        start_fraction=1.0,
        burst_tokens=1_000,
        window_seconds=10.0,
        max_leased=100,
        lease_seconds=60.0,
        max_wait_seconds=600,
        max_attempts=3,
    )
    settings.update(kw)
    return led.set_lane("r", **settings)


def charges(led) -> list[tuple[str, float, int, bool]]:
    _, rows = led.rows("select job_id, at, cost, sent from rate_charge order by at, job_id")
    return [(j, float(at), int(cost), bool(sent)) for j, at, cost, sent in rows]


def take(led, job_id):
    return led.take(tuple(led.job(job_id)[k] for k in ROW_KEYS))


def tick(led, clock):
    return led.db.transaction(lambda cur: admission.tick(cur, "r", now=clock.t, token="x"))


def test_a_lease_reaped_without_pick_up_frees_its_pending_room(led, clock):
    """X's waiter never picks its lease up and the lease expires: its request never went out, so the reap
    drops its pending charge, and Y fits at once (not only when X's grant leaves the window)."""
    lane(led, lease_seconds=5.0)
    x = led.submit("s", 10, "r", rate_cost=600, waiter="w")
    assert [le.job_id for le in led.tick("r")] == [x]
    assert charges(led) == [(x, clock.t, 600, False)]
    clock.t += 6.0
    y = led.submit("s", 10, "r", rate_cost=600)
    assert led.tick("r") == []  # (not reaped yet: X's room is held)
    assert led.reap().parked[0]["job_id"] == x
    assert charges(led) == [] and led.lane("r").window_used == 0
    assert [le.job_id for le in led.tick("r")] == [y]
    assert led.audit() == []


def test_a_lease_voided_by_a_retry_before_its_pick_up_frees_its_pending_room(led, clock):
    lane(led)
    x = led.submit("s", 10, "r", rate_cost=600, waiter="w", key="k")
    assert [le.job_id for le in led.tick("r")] == [x]
    assert led.submit("s", 10, "r", rate_cost=600, key="k", attempt=2) == x  # voids attempt 1's lease
    assert charges(led) == [] and led.lane("r").window_used == 0
    assert led.audit() == []


def test_a_pick_up_within_the_window_keeps_todays_timing(led, clock):
    """Picked up 2 s after the grant: counted from the pick-up, as before; a job blocked by the pending
    charge gets no timed tick (a pending charge never leaves on its own), and after the pick-up it does."""
    lane(led)
    t0 = clock.t
    x = led.submit("s", 10, "r", rate_cost=600, waiter="w")
    assert [le.job_id for le in led.tick("r")] == [x]
    y = led.submit("s", 10, "r", rate_cost=600)
    ticked = tick(led, clock)
    assert ticked.leases == [] and ticked.decision.head_reason == "burst" and ticked.retry_in is None
    clock.t = t0 + 2.0
    assert take(led, x) is not None
    assert charges(led) == [(x, t0 + 2.0, 600, True)]
    assert tick(led, clock).retry_in == pytest.approx(10.0)
    clock.t = t0 + 11.9
    assert led.tick("r") == []
    clock.t = t0 + 12.0
    assert [le.job_id for le in led.tick("r")] == [y]
    assert led.audit() == []


def test_a_lease_the_ticker_holds_is_sent_at_the_grant(led, clock):
    """No waiter: the tick hands the lease to its caller, whose request goes out now; its charge leaves the
    window from the grant, and a later pick-up of it does not bring a pruned charge back."""
    lane(led)
    t0 = clock.t
    x = led.submit("s", 10, "r", rate_cost=600)
    assert [le.job_id for le in led.tick("r")] == [x]
    assert charges(led) == [(x, t0, 600, True)]
    clock.t = t0 + 10.0
    y = led.submit("s", 10, "r", rate_cost=600)
    assert [le.job_id for le in led.tick("r")] == [y]
    assert take(led, x) is not None and led.lane("r").window_used == 600
    assert led.audit() == []


def test_a_lease_settled_without_pick_up_counts_from_the_settlement(led, clock):
    """Settled while its charge is pending (nobody called take: an operator settling it by id): its request
    went out at some moment before the settlement, so the charge counts a full window from it."""
    lane(led)
    x = led.submit("s", 10, "r", rate_cost=600, waiter="w")
    [lease] = led.tick("r")
    clock.t += 3.0
    led.settle(lease, 10)
    assert charges(led) == [(x, clock.t, 600, True)]
    assert led.lane("r").window_used == 600 and led.audit() == []


def test_the_audit_catches_a_window_used_that_disagrees_and_a_pending_charge_left_behind(led, clock):
    lane(led)
    x = led.submit("s", 10, "r", rate_cost=600)
    [lease] = led.tick("r")
    led.settle(lease, 10)
    assert led.audit() == []
    led.db.transaction(lambda cur: cur.execute("update lane set window_used = window_used + 1 where name = 'r'"))
    assert any("window_used 601 != sum of its charges 600" in line for line in led.audit())
    led.db.transaction(lambda cur: cur.execute("update lane set window_used = 600 where name = 'r'"))
    led.db.transaction(lambda cur: cur.execute("update rate_charge set sent = :f", {"f": False}))
    [line] = led.audit()
    assert f"job {x} attempt 1 is done but its charge is still pending" in line


def test_a_gate_whose_wait_ends_as_its_lease_is_handed_frees_the_pending_room(led, clock):
    """A gate's wait ends (a timeout) just as another process hands it a lease: it settles the unpicked lease
    at 0, and, its request never having gone out, the pending charge leaves the window; Y fits at once.
    (It used to be sent from the settlement: 600 rate tokens held for a window no request used.)"""
    from types import SimpleNamespace

    from lane_plugin.gating import waiting

    lane(led)
    x = led.submit("s", 10, "r", rate_cost=600, waiter="w")
    assert [le.job_id for le in led.tick("r")] == [x]  # handed to waiter w, whose gate has not picked it up
    assert charges(led) == [(x, clock.t, 600, False)] and led.job(x)["state"] == "leased"  # the fault's setting
    waiting.abandon(led, SimpleNamespace(job_id=x, lease=None), TimeoutError("wait ended"))
    job = led.job(x)
    assert (job["state"], job["actual"]) == ("failed", 0)
    assert charges(led) == [] and led.lane("r").window_used == 0
    y = led.submit("s", 10, "r", rate_cost=600)
    assert [le.job_id for le in led.tick("r")] == [y]
    assert led.audit() == []


def test_unsent_leaves_a_picked_up_lease_s_charge_alone_and_a_replay_bills_nothing(led, clock):
    lane(led)
    x = led.submit("s", 10, "r", rate_cost=600, waiter="w")
    led.tick("r")
    take(led, x)  # picked up: its request may be out
    [(_, at, _, sent)] = charges(led)
    assert sent
    first = led.settle(x, 0, attempt=1, outcome="failed", unsent=True)
    assert charges(led) == [(x, at, 600, True)] and led.lane("r").window_used == 600
    again = led.settle(x, 0, attempt=1, outcome="failed", unsent=True)
    assert again.replay and (again.actual, first.actual) == (0, 0) and led.lane("r").spent == 0
    assert led.audit() == []
