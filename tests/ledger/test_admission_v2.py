"""Issue 11 in the store, on SQLite and PostgreSQL: two currencies over a sliding window, the
finishing reserve learned from finished runs, and one stored priority."""

from __future__ import annotations

import pytest

from lane_plugin import InvalidInput, NeverFits

from ..tables import job_rows

T0 = 1_800_000_000.0  # a multiple of 10: a fixed window would start exactly here


def lane(led, **kw):
    settings = dict(
        allowance=100_000,
        ceiling=100_000,
        burst_tokens=500,
        window_seconds=10.0,
        max_leased=10,
        lease_seconds=30.0,
        max_wait_seconds=600,
    )
    return led.set_lane("t", **{**settings, **kw})


def window(led) -> tuple[int, int]:
    """``(lane.window_used, sum of its rate_charge rows)`` read with our own SQL."""
    _, [(used, charged)] = led.rows(
        "select window_used, (select coalesce(sum(cost), 0) from rate_charge "
        "where lane = 't') from lane where name = 't'"
    )
    return used, charged


def test_no_span_of_the_window_admits_more_than_the_burst(led, clock):
    """The fixed window let a burst through at 9.9 s and another at 10.1 s; the sliding one does not."""
    lane(led)
    clock.t = T0 + 9.9
    a = led.submit("s", 400, "t")
    assert [x.job_id for x in led.tick("t")] == [a]
    clock.t = T0 + 10.1  # a new fixed window would have opened at T0 + 10
    b = led.submit("s", 400, "t")
    assert led.tick("t") == [] and led.wait_status(b)["blocked_by"] == "burst"
    clock.t = T0 + 19.8
    assert led.tick("t") == []
    clock.t = T0 + 19.9  # the first charge has left (T0 + 9.9, T0 + 19.9]
    assert [x.job_id for x in led.tick("t")] == [b]
    assert window(led) == (400, 400)  # the pruned charge is gone from the rows and the counter
    assert led.audit(grace=10**6) == []


def test_the_window_counts_rate_cost_and_the_budget_counts_est(led, clock):
    lane(led)
    a = led.submit("s", 100, "t", rate_cost=450)
    clock.t += 1
    b = led.submit("s", 100, "t")
    [lease] = led.tick("t")
    assert lease.job_id == a and lease.rate_cost == 450  # 100 of budget, 450 of the rate window
    assert led.wait_status(b)["blocked_by"] == "burst"  # 450 + 100 > 500, though the budget has room
    clock.t += 10.0
    [lease] = led.tick("t")
    assert lease.job_id == b and lease.rate_cost == 100
    status = {s["lane"]: s for s in led.lanes()}["t"]
    assert (status["reserved"], status["window_used"]) == (100 + 100, 100)  # a's charge left at T + 10
    assert led.job(a)["rate_cost"] == 450 and led.job(b)["rate_cost"] == 100
    with pytest.raises(NeverFits, match="rate cost 501 exceeds the lane's burst of 500"):
        led.submit("s", 10, "t", rate_cost=501)
    with pytest.raises(InvalidInput, match="rate_cost"):
        led.submit("s", 10, "t", rate_cost=0)
    assert led.audit(grace=10**6) == []


def test_a_provider_counting_actual_tokens_trues_the_window_up(led, clock):
    lane(led, rate_basis="actual")
    a = led.submit("s", 300, "t", rate_cost=400)
    [lease] = led.tick("t")
    assert window(led) == (400, 400)
    led.settle(lease, 120)
    assert window(led) == (120, 120)  # the charge is what the provider counted
    b = led.submit("s", 300, "t", rate_cost=380)
    assert [x.job_id for x in led.tick("t")] == [b]  # 120 + 380 <= 500: fits only after the true-up
    lane(led, rate_basis="request")
    led.settle(b, 50)
    assert window(led) == (500, 500)  # request basis: the request's charge stands
    with pytest.raises(InvalidInput, match="rate_basis"):
        lane(led, rate_basis="sometimes")
    assert led.job(a)["state"] == "done" and led.audit(grace=10**6) == []


def _run_three_stages(led, clock, key: str, sizes=(100, 300, 200)) -> None:
    """One chained run: each stage submitted when the previous one settles."""
    for stage, size in zip(("draft", "critique", "final"), sizes):
        job = led.submit(stage, size, "t", run_key=key)
        [lease] = led.tick("t")
        assert lease.job_id == job
        clock.t += 5
        led.settle(lease, size)


def test_the_finishing_reserve_is_learned_and_kept_for_runs_under_way(led, clock):
    lane(led, ceiling=2_000, allowance=2_000, burst_tokens=2_000)
    for i in range(3):
        _run_three_stages(led, clock, f"old-{i}")  # 1,800 spent
    lane(led, ceiling=5_000, allowance=5_000, burst_tokens=5_000)
    clock.t += 60  # the old runs go quiet: after one lease (30 s) their reserve lapses, they count as finished
    profile = {p["stage"]: p for p in led.refit_runs("t")}
    assert (
        profile["draft"]["after_tokens"],
        profile["critique"]["after_tokens"],
        profile["final"]["after_tokens"],
    ) == (500, 200, 0)
    assert profile["draft"]["runs"] == 3 and profile["draft"]["hold_seconds"] == 2 * 5.0
    # 1,800 spent of 5,000. Run A starts: it reserves the 500 its draft is expected to be followed by.
    a = led.submit("draft", 100, "t", run_key="A")
    assert [x.job_id for x in led.tick("t")] == [a]
    assert led.lane("t").finishing == 500
    clock.t += 1
    led.settle(a, 100)  # 1,900 spent
    # A free job may not eat A's reserve; a new run may start only if its own rest fits too.
    free = led.submit("one-off", 2_700, "t")
    starter = led.submit("draft", 2_700, "t", run_key="B")  # 1,900 spent + 2,700 + its rest 500 > 5,000
    critique = led.submit("critique", 300, "t", run_key="A")
    assert [x.job_id for x in led.tick("t")] == [critique]  # the finishing job uses the reserve
    assert led.job(free)["state"] == "new" and led.wait_status(free)["blocked_by"] == "reserve"
    assert led.job(starter)["state"] == "parked" and "expected to need 3200" in led.job(starter)["reason"]
    assert led.lane("t").finishing == 200
    assert led.audit(grace=10**6) == []
    # A goes quiet past its hold (max(lease 30 s, 10 s)): its reserve lapses and the free job goes.
    clock.t += 31
    assert [x.job_id for x in led.tick("t")] == [free]
    assert led.lane("t").finishing == 0 and led.audit(grace=10**6) == []


def test_a_job_without_a_run_uses_the_whole_ceiling(led, clock):
    """No flat 80% stop by default: single calls spend the ceiling when no run needs a reserve."""
    lane(led, ceiling=1_000, allowance=1_000, burst_tokens=1_000)
    assert led.lane("t").start_fraction == 1.0
    jobs = [led.submit("call", 100, "t") for _ in range(10)]
    assert sorted(x.job_id for x in led.tick("t")) == sorted(jobs)
    assert led.lane("t").reserved == 1_000


def test_later_stages_are_read_from_their_own_head_behind_many_waiting_starters(led, clock):
    lane(led, ceiling=1_000, allowance=1_000, burst_tokens=10_000, max_leased=5, max_wait_seconds=0, start_fraction=0.8)
    first = led.submit("draft", 500, "t", run_key="run-1")
    [lease] = led.tick("t")
    led.settle(lease, 500)
    hog = led.submit("hog", 400, "t")
    assert [x.job_id for x in led.tick("t")] == [hog]  # 100 left
    for i in range(40):  # starters ahead of the later stage (past the start limit): more than the head reads
        led.submit("draft", 90 + i % 5, "t", run_key=f"new-{i}")
    clock.t += 1
    later = led.submit("final", 100, "t", run_key="run-1")
    assert led.job(later)["finishing"] in (True, 1)
    assert [x.job_id for x in led.tick("t")] == [later] and first


def test_priority_is_stored_and_follows_the_lane(led, clock):
    lane(led, ceiling=1_000, allowance=1_000, burst_tokens=1_000, max_wait_seconds=100)
    a = led.submit("s", 500, "t")
    assert led.job(a)["prio"] == pytest.approx(clock.t + 500 * 0.1)
    led.set_lane("t", max_wait_seconds=0)  # oldest first now: every waiting job's place follows
    assert led.job(a)["prio"] == pytest.approx(clock.t)
    led.park(a, "operator")
    clock.t += 7
    led.requeue(a)
    assert led.job(a)["prio"] == pytest.approx(clock.t)
    rows = job_rows(led, "id = :id", {"id": a})
    assert rows[0]["wait_since"] == clock.t


def test_a_job_without_a_run_is_never_start_limited(led):
    lane(led, ceiling=1_000, allowance=1_000, burst_tokens=1_000, start_fraction=0.5)
    one_off = led.submit("call", 900, "t")  # past the 500 start limit, but it starts no run
    with pytest.raises(NeverFits, match="start limit of 500"):
        led.submit("draft", 900, "t", run_key="r")
    assert [x.job_id for x in led.tick("t")] == [one_off]


def test_a_lease_picked_up_late_is_charged_from_when_its_request_goes_out(led, clock):
    """A waiter polls: the tick that granted its lease may have run seconds before it sends its request."""
    lane(led)
    a = led.submit("s", 300, "t")
    assert [x.job_id for x in led.tick("t")] == [a]  # granted at T
    clock.t += 4
    lease = led.acquire(a)  # the holder picks it up at T + 4: its request goes out now
    assert lease.job_id == a and lease.rate_cost == 300
    b = led.submit("s", 300, "t")
    clock.t += 7  # T + 11: past the window from the grant, not from the request
    assert led.tick("t") == [] and led.wait_status(b)["blocked_by"] == "burst"
    clock.t += 3  # T + 14 > T + 4 + 10
    assert [x.job_id for x in led.tick("t")] == [b]
    assert window(led) == (300, 300) and led.audit(grace=10**6) == []
