"""A lane's limits over requests, input and output tokens, a provider's pause, and intake refusal (issue 24).

Every test runs on SQLite and PostgreSQL (the ``led`` fixture) with the injected clock.
"""

from __future__ import annotations

import pytest

from lane_plugin.errors import InvalidInput, NeverFits, UnknownJob, UnknownLane
from lane_plugin.policy.limits import Limit


def _lane(led, name="l", **kw):
    settings = dict(
        allowance=10**9, ceiling=10**9, burst_tokens=10**6, window_seconds=10.0, max_leased=50, lease_seconds=600
    )
    settings.update(kw)
    return led.set_lane(name, **settings)


def _output_used(led, lane="l") -> int:
    """What lane's output_tokens window holds now, as lane status reads it."""
    (row,) = [r for r in led.lanes() if r["lane"] == lane]
    (use,) = [u for u in row["limit_use"] if u["unit"] == "output_tokens"]
    return use["used"]


def _ids(leases):
    return sorted(lease.job_id for lease in leases)


def test_the_requests_limit_admits_that_many_per_window_and_no_more(led, clock):
    _lane(led, limits=["requests=3/10s"])
    jobs = [led.submit("s", 10, "l") for _ in range(5)]
    first = led.tick("l")
    assert len(first) == 3  # tokens and leases leave room for 5: the requests limit binds
    for lease in first:
        led.settle(lease, 10)
    clock.t += 5.0
    assert led.tick("l") == []  # settled, but still in the window
    clock.t += 5.0  # (10 s after the admissions: they leave the window)
    assert len(led.tick("l")) == 2
    assert {led.job(j)["state"] for j in jobs} == {"done", "leased"}
    assert led.audit() == []


def test_input_and_output_limits_count_the_split_and_output_is_trued_up_to_the_actual(led, clock):
    _lane(led, limits={"input_tokens": "1000/60s", "output_tokens": "500/60s"})
    a = led.submit("s", 700, "l", rate_cost={"input": 400, "output": 300})
    b = led.submit("s", 700, "l", rate_cost={"input": 400, "output": 300})
    leases = led.tick("l")
    assert len(leases) == 1 and _output_used(led) == 300  # 300 + 300 output would pass 500; inputs (800) fit
    led.settle(leases[0], 450)  # generated 50 (450 - 400 input): the output window now holds 50
    (second,) = led.tick("l")
    assert {leases[0].job_id, second.job_id} == {a, b}
    assert led.job(a)["rate_input"] == 400 and led.job(a)["rate_output"] == 300
    assert led.audit() == []  # every limit's window is the sum of its charges


def test_the_split_comes_from_est_input_when_no_dict_states_it(led):
    _lane(led, limits=["output_tokens=500/60s"])
    j = led.submit("s", 900, "l", est_input=600)
    row = led.job(j)
    assert (row["rate_input"], row["rate_output"]) == (600, 300)
    assert len(led.tick("l")) == 1


def test_a_job_that_can_never_pass_a_limit_is_refused_at_intake(led):
    _lane(led, limits=["output_tokens=500/60s"])
    with pytest.raises(NeverFits, match="output_tokens 600 exceeds the limit output_tokens 500/60s"):
        led.submit("s", 700, "l", rate_cost={"input": 100, "output": 600})
    # an unknown split counts the whole rate cost against the output limit, cautiously
    with pytest.raises(NeverFits, match="output_tokens 700 exceeds"):
        led.submit("s", 700, "l")


def test_lowering_a_limit_parks_a_waiting_job_it_leaves_no_way_to_fit(led):
    _lane(led, limits=["requests=5/60s"], period="daily")
    j = led.submit("s", 700, "l", rate_cost={"input": 100, "output": 600})
    fits = led.submit("s", 700, "l", rate_cost={"input": 300, "output": 400})
    parked: list[dict] = []
    led.set_lane("l", limits=["output_tokens=500/60s"], parked=parked)
    assert led.job(j)["state"] == "parked" and led.job(fits)["state"] == "new"
    assert "output_tokens 600 exceeds the limit" in led.tail("l")[0]["reason"]
    assert [t["job_id"] for t in parked] == [j] and parked[0]["reason"] == led.tail("l")[0]["reason"]


def test_limits_are_set_shown_and_dropped(led):
    row = _lane(led, limits=["requests=500/60s", "tokens=30000/60s", "output_tokens=8000/60s"])
    assert dict(row.policy.all_limits) == {
        "tokens": Limit(30000, 60.0),
        "requests": Limit(500, 60.0),
        "output_tokens": Limit(8000, 60.0),
    }
    assert (row.burst_tokens, row.window_seconds) == (30000, 60.0)  # tokens is the burst window
    (lane,) = [x for x in led.lanes() if x["lane"] == "l"]
    assert lane["limits"] == ["tokens 30000/60s", "requests 500/60s", "output_tokens 8000/60s"]
    row = led.set_lane("l", limits=["requests=none", "tokens=none"])
    assert dict(row.policy.all_limits) == {"output_tokens": Limit(8000, 60.0)}
    assert led.submit("s", 10**5, "l", rate_cost={"input": 10**5 - 1, "output": 1})  # no tokens limit now


def test_bad_limit_syntax_names_the_value(led):
    _lane(led)
    with pytest.raises(InvalidInput, match="requests=500"):
        led.set_lane("l", limits=["requests=500"])
    with pytest.raises(InvalidInput, match="unknown unit 'rpm'"):
        led.set_lane("l", limits=["rpm=5/60s"])


@pytest.mark.parametrize(
    "limits, needle",
    [
        ({"requests": Limit(5, float("nan"))}, "number of seconds"),  # once a NOT NULL failure (a database error)
        ({"requests": Limit(5, float("inf"))}, "a year"),  # once a traceback reading the stored spec back
        ({"requests": Limit(5.5, 60.0)}, "whole number"),
        ({"requests": Limit(10**30, 60.0)}, "at most"),  # once OverflowError from the driver
        ({"requests": "99999999999999999999/60s"}, "at most"),
        (["requests=5/0.00001s"], "from 1ms"),  # stored as 1e-05s, which once did not read back
        (5, "expected"),  # once TypeError: 'int' object is not iterable
        (["requests=5/60s", "requests=6/60s"], "limited twice"),
    ],
)
def test_a_bad_limit_is_refused_naming_it_and_nothing_is_written(led, limits, needle):
    before = _lane(led, limits=["requests=7/10s"])
    with pytest.raises(InvalidInput, match=needle) as err:
        led.set_lane("l", limits=limits)
    assert err.value.field in ("limit", "limits")
    assert led.lane("l") == before


def test_a_pause_of_a_lane_that_does_not_exist_is_not_remembered(led):
    with pytest.raises(UnknownLane):
        led.pause("nolane", 5.0, reason="429")
    assert led.paused_here("nolane") == 0.0 and led.paused_for("nolane") == 0.0  # once 5 s in process memory
    with pytest.raises(InvalidInput, match="invalid seconds nan"):
        led.remember_pause("l", float("nan"))


def test_a_pause_for_an_unknown_job_is_refused_and_nothing_is_paused(led):
    """``pause(job_id=...)`` counts the 429 on the job; a job the ledger does not have was accepted silently (the
    count went nowhere). It is UnknownJob, as every call with an unknown job id, and nothing is paused."""
    _lane(led)
    with pytest.raises(UnknownJob, match="unknown job 'no-such-job'"):
        led.pause("l", 5.0, reason="429", job_id="no-such-job")
    assert led.rows("select paused_until from lane where name = 'l'")[1][0][0] is None  # rolled back
    assert led.paused_here("l") == 0.0 and led.paused_for("l") == 0.0  # and not remembered in this process
    j = led.submit("s", 10, "l")
    assert led.pause("l", 5.0, reason="429", job_id=j) > 0 and led.job(j)["rate_limited"] == 1


def test_a_pause_closes_the_lane_until_then_and_it_reopens_on_time(led, clock):
    _lane(led)
    j = led.submit("s", 10, "l")
    events = []
    led.listeners.append(lambda e, lane, p: events.append((e, p)))
    until = led.pause("l", 12.5, reason="429 from the provider", job_id=j)
    assert until == clock.t + 12.5
    assert led.tick("l") == []  # the provider's word wins: nothing is leased into a closed lane
    assert led.job(j)["rate_limited"] == 1
    assert events and events[0][0] == "lane.paused" and events[0][1]["until"] == until
    assert led.pause("l", 2.0, reason="a shorter one") == until  # the longest word wins
    clock.t += 12.4
    assert led.tick("l") == []
    clock.t += 0.1
    assert _ids(led.tick("l")) == [j]


def test_a_paused_tick_asks_to_be_woken_at_the_reopen(led, clock):
    from lane_plugin.ledger import admission

    _lane(led)
    led.submit("s", 10, "l")
    led.pause("l", 3.0, reason="429")
    ticked = led._run(lambda cur, now: admission.tick(cur, "l", now=now, token="t"))
    assert ticked.decision.head_reason == "paused" and ticked.retry_in == pytest.approx(3.0)


def test_a_pause_wakes_this_process_waiters_at_the_reopen(led, clock, monkeypatch):
    """The pause itself (not only a later tick) asks this process's watcher for a tick at the reopen."""
    _lane(led)
    asked = []
    monkeypatch.setattr(led.wakeups, "tick_at", lambda lane, delay: asked.append((lane, delay)))
    led.pause("l", 4.0, reason="429")
    assert asked == [("l", pytest.approx(4.0))]


def test_a_limit_blocked_tick_asks_to_be_woken_when_its_window_slides(led, clock):
    from lane_plugin.ledger import admission

    _lane(led, limits=["requests=1/10s"])
    led.submit("s", 10, "l")
    led.submit("s", 10, "l")
    assert len(led.tick("l")) == 1
    clock.t += 4.0
    ticked = led._run(lambda cur, now: admission.tick(cur, "l", now=now, token="t"))
    assert ticked.decision.head_reason == "limit:requests" and ticked.retry_in == pytest.approx(6.0)


def test_the_providers_count_trues_the_window_up_with_a_margin_for_the_outside_spend_to_come(led, clock):
    _lane(led, limits=["requests=20/60s"])
    for _ in range(4):
        led.submit("s", 10, "l")
    assert len(led.tick("l")) == 4  # the lane's own 4, sent
    # The provider counts 10: 6 outside the lane. 4 of the lane's requests in the window bring 4 counts a
    # window, so the outside spend expected before the next count is 6 / 4, rounded up: 2. The window holds
    # 10 + 2 = 12 of 20: 8 more fit.
    led.provider_used("l", {"requests": 10})
    for _ in range(10):
        led.submit("s", 10, "l")
    assert len(led.tick("l")) == 8
    # A lower count lowers the outside spend (the other client slowed down), never the lane's own, and no faster
    # than the charge it replaces would have left the window: 12 of its own, a count of 13 shows 1 outside and
    # 1 more expected (2), but the 8 held a moment ago stay (counts come back out of order)
    led.provider_used("l", {"requests": 13})
    assert led.tick("l") == []
    clock.t += 30.0  # half the window later: the 8 count for 4; 12 + 4 of 20, the 2 waiting fit
    led.provider_used("l", {"requests": 13})
    assert len(led.tick("l")) == 2
    assert led.audit() == []


def test_a_count_is_compared_with_what_the_lane_had_sent_when_the_counted_request_arrived(led, clock):
    # The provider counts a request when it arrives; the response comes back a moment later, after the lane
    # has sent more. Those are not in the count: read as the lane's own, they would hide outside spend.
    _lane(led, limits=["requests=20/10s"])
    first = led.submit("s", 10, "l")
    assert len(led.tick("l")) == 1
    clock.t += 0.5
    for _ in range(5):
        led.submit("s", 10, "l")
    assert len(led.tick("l")) == 5  # sent while the first request was answered
    # the count on the first request's response: its own 1 and 6 outside
    led.provider_used("l", {"requests": 7}, job_id=first)
    for _ in range(10):
        led.submit("s", 10, "l")
    # 6 of its own, 6 outside and 6 / 6 = 1 more expected before the next count: 13 of 20, 7 fit (compared
    # with all 6 of its own, the 7 would have shown 1 outside and let 12 in: 4 over the provider's 20)
    assert len(led.tick("l")) == 7
    assert led.audit() == []


def test_a_count_is_compared_with_the_lanes_own_requests_in_the_window_of_the_counted_requests_arrival(led, clock):
    # The send slack dates a request's charge after its send; answered sooner than that, the count comes back
    # while the lane's window still holds its own requests of a window before, which the provider's window at
    # the counted request's arrival had already let go. Compared with them, the count shows outside spend gone.
    _lane(led, limits=["requests=10/10s"])
    led.send_slack = 0.5
    batch = [led.submit("s", 10, "l") for _ in range(5)]
    assert len(led.tick("l")) == 5
    for job in batch:
        led.sent_now(job, 1)  # sent now: dated now + 0.5 s
    clock.t += 10.2  # the provider's window let the 5 go (10 s after they arrived); the lane's holds them 0.3 s more
    counted = led.submit("s", 10, "l")
    assert len(led.tick("l")) == 1
    led.sent_now(counted, 1)
    clock.t += 0.1  # answered: the provider counted it and 4 outside, not the 5 of a window before
    led.provider_used("l", {"requests": 5}, job_id=counted)
    assert led.rows("select cost from limit_charge where job_id = 'provider:l'")[1] == [(5,)]  # 4 and 1 expected
    clock.t += 0.3  # the 5 left the lane's window too
    for _ in range(10):
        led.submit("s", 10, "l")
    # its 1, 4 outside and 1 more expected: 4 fit (compared with its 6, the count showed none outside: 9 went,
    # 4 over the provider's 10)
    assert len(led.tick("l")) == 4
    assert led.audit() == []


def test_the_outside_spend_a_count_shows_holds_the_window_for_a_window_after_the_latest_count(led, clock):
    # A shared key stays shared: the outside spend is there as long as counts keep showing it. Dated at the
    # first count only, it would leave the lane's window while the other client keeps spending.
    _lane(led, limits=["requests=40/10s"])
    led.submit("s", 10, "l")
    assert len(led.tick("l")) == 1
    led.provider_used("l", {"requests": 9})  # 8 outside, 8 more expected: 17 of 40
    clock.t += 8.0
    led.submit("s", 10, "l")
    assert len(led.tick("l")) == 1
    led.provider_used("l", {"requests": 10})  # the other client's 8 again (its first 8 left, 8 new came)
    clock.t += 3.0  # 11 s after the first count: the lane's first request left the window, the outside did not
    for _ in range(30):
        led.submit("s", 10, "l")
    # its 1 in the window (3 s ago), 8 outside and 8 / 2 = 4 more expected: 13 of 40, 27 fit
    assert len(led.tick("l")) == 27
    assert led.audit() == []


def test_own_charges_that_left_the_window_do_not_hide_outside_spend(led, clock):
    _lane(led, limits=["requests=10/10s"])
    for _ in range(5):
        led.submit("s", 10, "l")
    assert len(led.tick("l")) == 5
    clock.t += 11.0  # the lane's 5 left the provider's window; its count of 5 is all outside spend
    led.provider_used("l", {"requests": 5})
    for _ in range(10):
        led.submit("s", 10, "l")
    # 5 outside, and as much again expected before a count (the lane has no request in the window to bring
    # one): full. Compared with the lane's unpruned 5 of its own, the 5 would have looked like the lane's own.
    assert led.tick("l") == []
    assert led.audit() == []


def test_the_output_charge_counts_from_the_settlement_as_the_provider_counts_output_as_generated(led, clock):
    _lane(led, limits=["output_tokens=500/60s"])
    a = led.submit("s", 400, "l", rate_cost={"input": 100, "output": 300})
    (lease,) = led.tick("l")
    clock.t += 50.0
    led.settle(lease, 400)  # generated 300, counted from now: until 110 s after the admission
    b = led.submit("s", 400, "l", rate_cost={"input": 100, "output": 300})
    clock.t += 11.0  # 61 s after the admission, 11 s after the settlement
    assert led.tick("l") == []
    clock.t += 49.0
    assert [x.job_id for x in led.tick("l")] == [b] and led.job(a)["state"] == "done"
    assert led.audit() == []


def test_a_call_longer_than_the_window_counts_its_output_from_its_settlement(led, clock):
    _lane(led, limits=["output_tokens=500/60s"])
    led.submit("s", 400, "l", rate_cost={"input": 100, "output": 200})
    (lease,) = led.tick("l")
    clock.t += 70.0
    b = led.submit("s", 400, "l", rate_cost={"input": 100, "output": 200})
    (second,) = led.tick("l")
    assert second.job_id == b and _output_used(led) == 200  # the first call's allowance has left the window
    led.settle(lease, 500)  # it generated 400: the provider counts them now, and so does the lane
    assert _output_used(led) == 600
    c = led.submit("s", 400, "l", rate_cost={"input": 100, "output": 200})
    clock.t += 1.0
    assert led.tick("l") == []
    led.settle(second, 150)  # generated 50
    clock.t += 59.5  # 60.5 s after the long call settled: its 400 left, the second's 50 holds
    assert [x.job_id for x in led.tick("l")] == [c]
    assert led.audit() == []


def test_a_lease_lost_during_its_call_counts_its_output_from_its_late_settlement(led, clock):
    # The gate's own path: the lease expired and was reaped while the call ran; the call ends, the gate
    # settles late at once. The provider counted what the call generated; so must the lane.
    _lane(led, limits=["output_tokens=500/60s"], lease_seconds=30)
    j = led.submit("s", 400, "l", rate_cost={"input": 100, "output": 300})
    (lease,) = led.tick("l")
    clock.t += 90.0
    led.reap()
    assert led.job(j)["state"] != "leased"  # the lease really expired
    assert _output_used(led) == 0  # and its allowance left the window
    led.settle(lease, 600)
    assert _output_used(led) == 500
    assert led.audit() == []


def test_the_output_the_caller_states_is_what_the_output_window_counts(led, clock):
    _lane(led, limits=["output_tokens=500/60s"])
    a = led.submit("s", 5_400, "l", rate_cost={"input": 5_100, "output": 300})
    (lease,) = led.tick("l")
    for bad in (-1, True, 1.5, 10**12 + 1, "40"):
        with pytest.raises(InvalidInput, match="output"):
            led.settle(lease, 640, output=bad)
    assert led.job(a)["state"] == "leased" and _output_used(led) == 300  # nothing written
    led.settle(lease, 640, output=40)  # cache reads billed at a tenth: 640 - 5,100 would read as no output
    assert _output_used(led) == 40
    assert led.audit() == []


def _moved_during_its_call(led, clock, billed, fallback, billed_limits, fallback_limits):
    """A job leased in ``billed``, its lease lost during the call, then moved to ``fallback``: its first lease."""
    _lane(led, fallback, limits=fallback_limits, lease_seconds=10)
    _lane(led, billed, fallback=fallback, limits=billed_limits, lease_seconds=10, max_wait_seconds=600)
    j = led.submit("s", 400, billed, rate_cost={"input": 100, "output": 300}, fallback=True)
    (first,) = led.tick(billed)
    clock.t += 11.0
    assert led.reap().requeued == [j]  # the lease really expired
    assert led.give_up_waiting(j, "deadline") == fallback  # and the job really moved
    led.tick(billed)
    return first


@pytest.mark.parametrize("billed, fallback", [("a", "b"), ("z", "b")])  # (the lanes' lock order both ways)
def test_a_late_settlement_charges_the_output_to_the_lane_whose_provider_ran_the_call(led, clock, billed, fallback):
    first = _moved_during_its_call(led, clock, billed, fallback, ["output_tokens=500/5s"], ["output_tokens=500/5s"])
    settled = led.settle(first, 600)
    assert settled.lane == billed
    assert _output_used(led, billed) == 500 and _output_used(led, fallback) == 0
    assert led.settle(first, 600).replay and _output_used(led, billed) == 500  # a replay charges nothing more
    assert led.audit() == []


def test_a_late_settlement_in_a_lane_without_an_output_limit_charges_no_output(led, clock):
    first = _moved_during_its_call(led, clock, "a", "b", [], ["output_tokens=500/5s"])
    led.settle(first, 600)
    assert _output_used(led, "b") == 0
    assert led.audit() == []


def test_a_pause_is_seen_in_its_process_before_its_write_commits(led):
    # The write may wait for the database's lock under load: this process's workers must not send meanwhile.
    _lane(led)
    run = led._run
    seen: list[float] = []

    def slow_write(fn, **kw):
        if kw.get("write", True) and not seen:  # the pause's write, before it commits: another worker checks
            seen.append(-1.0)
            seen.append(led.paused_for("l"))
        return run(fn, **kw)

    led._run = slow_write
    try:
        led.pause("l", 5.0, reason="429 from the provider")
    finally:
        led._run = run
    assert seen[0] == -1.0  # the check ran inside the write
    assert 4.0 < seen[1] <= 5.0  # and found the lane closed
    assert led.paused_here("l") > 4.0  # still closed in this process's memory (not reopening)
    assert led.rows("select paused_until from lane where name = 'l'")[1][0][0] is not None  # and written
