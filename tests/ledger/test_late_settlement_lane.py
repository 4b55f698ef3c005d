"""A late settlement is billed to the lane its attempt was leased in, whatever lane the job is in now (both databases).

Lanes a and b, a falls back to b. Attempt 1 is leased in a, its lease expires, the reap requeues the job
(attempt 2) and it moves to b (its waiting deadline, or a's preflight failing). A late settlement of
attempt 1 bills a: a's provider billed those tokens, and a's ceiling must see them.
"""

from __future__ import annotations

import pytest

from lane_plugin import ConflictingReplay, InvalidInput, Ledger

from .test_review_attacks import lane, moved_zombie


def spent(led):
    return led.lane("a").spent, led.lane("b").spent


def billed(led):
    return led.rows("select attempt, lane, actual, late from settlement order by attempt")[1]


def test_a_replay_of_the_late_settlement_after_the_move_is_the_first_result_and_bills_nothing(led, clock):
    first = moved_zombie(led, clock, "request", "request")
    got = led.settle(first, 500)
    assert (got.lane, got.late, got.replay) == ("a", True, False)
    again = led.settle(first, 500)
    assert (again.lane, again.late, again.replay, again.actual) == ("a", True, True, 500)
    assert spent(led) == (500, 0)
    [second] = led.tick("b")  # the job runs in b now: the replay of attempt 1 is still a's, billed once
    assert led.settle(first, 500).replay and led.settle(first.job_id, 500, attempt=1).replay
    with pytest.raises(ConflictingReplay):
        led.settle(first, 501)
    assert spent(led) == (500, 0) and led.lane("b").reserved == second.est
    assert billed(led) == [(1, "a", 500, True)]
    assert led.audit() == []


def test_an_attempt_leased_in_b_after_the_move_is_billed_to_b_late_or_live(led, clock):
    """The lane of the job's latest lease is not the lane of every attempt: attempt 1 (a) settles late while
    attempt 2 holds a live lease in b, attempt 2 then expires and settles late after attempt 3 is waiting."""
    first = moved_zombie(led, clock, "request", "request")
    [second] = led.tick("b")
    assert (second.lane, second.attempt) == ("b", 2)
    assert led.settle(first, 500).lane == "a"  # attempt 2 live in b meanwhile: untouched
    assert led.job(first.job_id)["state"] == "leased" and led.lane("b").reserved == second.est
    clock.t += 11
    assert led.reap().requeued == [first.job_id]  # attempt 3 waits in b
    late = led.settle(second, 70)
    assert (late.lane, late.late) == ("b", True)
    assert spent(led) == (500, 70)
    [third] = led.tick("b")
    live = led.settle(third, 30)
    assert (live.lane, live.late, live.attempt) == ("b", False, 3)
    assert spent(led) == (500, 100)
    assert billed(led) == [(1, "a", 500, True), (2, "b", 70, True), (3, "b", 30, False)]
    assert led.audit() == []


def test_the_audit_is_clean_on_both_lanes_with_their_own_settlements(led, clock):
    """Each lane's spent is the sum of its settlements (I3) and its overage theirs (I1): b's own jobs and
    the moved job's attempts, each where it ran."""
    first = moved_zombie(led, clock, "request", "request")
    own = led.submit("s", 40, "b")
    leases = {x.job_id: x for x in led.tick("b")}
    assert set(leases) == {own, first.job_id}
    led.settle(first, 500)
    led.settle(leases[own], 45)
    led.settle(leases[first.job_id], 90)
    assert spent(led) == (500, 135)
    assert (led.lane("a").overage, led.lane("b").overage) == (500, 5)
    assert led.audit() == []


def test_a_late_settlement_after_a_s_period_rolled_counts_in_a_s_new_period(led, clock):
    """As any late settlement: in the period it arrives in, of the lane it bills (a rolls first)."""
    day = 86_400.0
    clock.t = (clock.t // day + 1) * day - 20.0  # 20 s before midnight (UTC)
    lane(led, "b", period="daily")
    lane(led, "a", fallback="b", period="daily")
    job = led.submit("s", 100, "a", fallback=True)
    [first] = led.tick("a")
    early = led.submit("s", 10, "a")
    [other] = led.tick("a")
    led.settle(other, 10)  # a's old day: 10
    clock.t += 11
    assert led.reap().requeued == [job]
    assert led.give_up_waiting(job, "deadline") == "b"
    clock.t += 20  # past midnight, before any tick of a
    assert led.settle(first, 500).lane == "a"
    a = led.lane("a")
    assert (a.spent, a.period_start) == (500, clock.t // day * day)
    assert led.lane("b").spent == 0 and led.job(early)["state"] == "done"
    assert led.audit() == []


def test_a_job_moved_by_a_s_failed_preflight_bills_a_late_attempt_to_a(ledger_url, led, clock):
    from lane_plugin import register_preflight, unregister_preflight

    from . import preflight_checks

    first = None
    register_preflight("late-lane-down", preflight_checks.down)
    try:
        lane(led, "b")
        lane(led, "a", fallback="b")
        job = led.submit("s", 100, "a", fallback=True)
        [first] = led.tick("a")
        clock.t += 11
        assert led.reap().requeued == [job]
        led.set_lane("a", preflight="late-lane-down")
        fresh = Ledger(ledger_url, clock=clock)  # (the first ledger keeps a's preflight spec for a while)
        try:
            assert fresh.tick("a") == [] and fresh.job(job)["lane"] == "b"
        finally:
            fresh.close()
    finally:
        unregister_preflight("late-lane-down")
    assert led.settle(first, 500).lane == "a"
    assert spent(led) == (500, 0) and led.audit() == []


def test_a_lane_a_moved_job_ran_in_is_not_deleted(led, clock):
    """Its late settlements bill it: deleting it would leave their tokens counted nowhere."""
    moved_zombie(led, clock, "request", "request")
    with pytest.raises(InvalidInput, match="moved to their fallback"):
        led.delete_lane("a")
    lane(led, "c")
    led.delete_lane("c")  # (an unused lane still goes)


def test_postgresql_a_late_settlement_locks_the_two_lanes_in_name_order_as_the_reaper_does(ledger_url, led, clock):
    """A writer holding lane a and then locking b (the reaper's order: all lanes by name) is never
    deadlocked by a late settlement of a job that moved from a to b: the settlement waits for a before it
    takes b (it bails out of the one-statement live path before any lock), so b is free at once. (Out of
    order, PostgreSQL finds the deadlock after deadlock_timeout, 1 s: b waits about 0.7 s here.)"""
    import threading
    import time

    from lane_plugin.ledger.lanes import lock_lane

    if not ledger_url.startswith("postgresql"):
        pytest.skip("SQLite locks the whole database: no lock order between lanes")
    first = moved_zombie(led, clock, "request", "request")
    other = Ledger(ledger_url, clock=clock)
    holding, out = threading.Event(), {}

    def reaper_like(cur):
        lock_lane(cur, "a")
        holding.set()
        time.sleep(0.3)  # the settlement has started and waits (for a, if it locks in name order)
        t0 = time.perf_counter()
        lock_lane(cur, "b")
        out["b_wait"] = time.perf_counter() - t0

    def settle():
        holding.wait(5)
        out["settled"] = led.settle(first, 500)

    t = threading.Thread(target=settle)
    t.start()
    try:
        other.db.transaction(reaper_like)
    finally:
        t.join(30)
        other.close()
    assert out["b_wait"] < 0.5, f"lane b was held by the settlement for {out['b_wait']:.2f}s: locks out of name order"
    assert out["settled"].lane == "a" and spent(led) == (500, 0) and led.audit() == []


def test_the_run_bill_puts_a_late_attempt_s_tokens_in_the_lane_that_billed_them(led, clock):
    """The run's bill adds up per lane to what each lane spent: attempt 1's 500 (leased in a, settled late after
    the move) on a's line, attempt 2's 90 on b's, where the job is counted (review: the bill grouped every
    attempt under the job's lane now, so a's 500 showed as b's)."""
    lane(led, "b")
    lane(led, "a", fallback="b")
    job = led.submit("s", 100, "a", fallback=True, run_key="run-1")
    [first] = led.tick("a")
    clock.t += 11
    assert led.reap().requeued == [job]
    assert led.give_up_waiting(job, "deadline") == "b"
    assert led.settle(first, 500).lane == "a"
    [second] = led.tick("b")
    assert led.settle(second, 90).lane == "b"
    assert spent(led) == (500, 90)
    lines = {(x.stage, x.lane): x for x in led.run_bill("run-1")}
    a, b = lines[("s", "a")], lines[("s", "b")]
    assert (a.jobs, a.settled, a.estimated, a.actual, a.late, a.drift) == (0, 0, 0, 500, 1, None)
    assert (b.jobs, b.settled, b.estimated, b.actual, b.late, b.unsettled) == (1, 1, 100, 90, 0, 0)
    assert sum(x.actual for x in lines.values()) == led.job(job)["actual"] == 590
    assert led.audit() == []
