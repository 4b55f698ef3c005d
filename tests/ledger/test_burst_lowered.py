"""A job its lane's new settings leave no way to fit is parked (or moved to its fallback) when they change.

Intake refuses a job that can never fit; one gets there when an operator lowers a lane's burst under a
waiting job's rate cost (or its ceiling under its estimate). An outside review found such a job waiting
for ever in a lane with a period (no reset lowers a rate cost) while ``wait_status`` blamed another
rule. Now the settings' own transaction parks it, or moves it to its fallback, with the reason.
"""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("period", ["daily", "none"])
def test_a_job_left_past_a_lowered_burst_is_parked_with_the_reason(led, period):
    led.set_lane(
        "b",
        allowance=10**6,
        ceiling=10**6,
        start_fraction=1.0,
        burst_tokens=1_000,
        window_seconds=10.0,
        max_leased=4,
        lease_seconds=60,
        period=period,
    )
    small = led.submit("s", 100, "b", rate_cost=200)
    big = led.submit("s", 100, "b", rate_cost=800)  # fits the burst of 1,000 at intake
    led.set_lane("b", burst_tokens=500)  # the operator lowers it: 800 can never fit now
    assert led.job(big)["state"] == "parked"  # at once, by the change itself
    (tail,) = [t for t in led.tail("b") if t["job_id"] == big]
    assert "rate cost 800 exceeds the lane's burst of 500" in tail["reason"] and "settings changed" in tail["reason"]
    assert [lease.job_id for lease in led.tick("b")] == [small]  # the rest of the lane goes on


def test_a_lowered_ceiling_parks_what_can_no_longer_fit_and_leaves_the_rest(led):
    led.set_lane("c", allowance=10**6, ceiling=10_000, max_leased=4, lease_seconds=60, period="daily")
    big, small = led.submit("s", 6_000, "c"), led.submit("s", 3_000, "c")
    led.set_lane("c", max_leased=8)  # a change that lowers nothing parks nothing
    assert led.job(big)["state"] == "new"
    led.set_lane("c", ceiling=5_000)
    assert (led.job(big)["state"], led.job(small)["state"]) == ("parked", "new")
    assert [lease.job_id for lease in led.tick("c")] == [small] and led.audit() == []
    assert led.audit() == []


def test_a_job_past_a_lowered_burst_moves_to_its_fallback_where_it_fits(led):
    led.set_lane("wide", allowance=10**6, ceiling=10**6, burst_tokens=10_000, max_leased=4, lease_seconds=60)
    led.set_lane(
        "b",
        allowance=10**6,
        ceiling=10**6,
        burst_tokens=1_000,
        max_leased=4,
        lease_seconds=60,
        period="daily",
        fallback="wide",
    )
    big = led.submit("s", 100, "b", rate_cost=800, fallback=True)  # may fall back to the lane's fallback
    led.set_lane("b", burst_tokens=500)
    assert led.job(big)["lane"] == "wide" and led.job(big)["state"] == "new"
    assert [lease.job_id for lease in led.tick("wide")] == [big]


def test_an_allowance_that_moves_a_default_ceiling_under_a_waiting_job_parks_it(led):
    led.set_lane("a", allowance=10_000, max_leased=4, lease_seconds=60, period="daily")  # ceiling 8,000 (80%)
    big = led.submit("s", 7_000, "a")
    led.set_lane("a", allowance=5_000)  # the default ceiling follows: 4,000
    assert led.lane("a").ceiling == 4_000 and led.job(big)["state"] == "parked"
