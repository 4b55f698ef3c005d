"""A ceiling lowered under what a lane already admitted this period is refused unless forced (an outside
review: ``lane lanes set free --allowance 5``, a typo, stopped the lane silently and ``lane audit`` then
failed I1)."""

from __future__ import annotations

import pytest

from lane_plugin.errors import InvalidInput


def lane(led, **kw):
    return led.set_lane("c", **{**dict(allowance=12_500, ceiling=10_000, burst_tokens=10_000, max_leased=5), **kw})


def spend(led, clock):
    lane(led)
    led.submit("s", 600, "c")
    [lease] = led.tick("c")
    led.settle(lease, 668)  # overage 68
    led.submit("s", 300, "c")
    led.tick("c")  # reserved 300: admitted 600 + 300 = 900 this period


def test_a_ceiling_under_what_was_admitted_is_refused_and_nothing_is_written(led, clock):
    spend(led, clock)
    for settings in (dict(ceiling=100), dict(allowance=5)):  # the default ceiling (80%) follows the allowance
        with pytest.raises(
            InvalidInput, match=r"a ceiling of (100|4), under the 900 tokens it has already admitted"
        ) as err:
            led.set_lane("c", **settings)
        assert err.value.field in settings
    row = led.lane("c")
    assert (row.ceiling, row.allowance) == (10_000, 12_500)
    assert led.audit() == []


def test_a_ceiling_lowered_to_what_was_admitted_or_above_is_taken(led, clock):
    spend(led, clock)
    assert led.set_lane("c", ceiling=900).ceiling == 900
    assert led.audit() == []


def test_force_lowers_it_anyway_and_the_lane_admits_nothing_more(led, clock):
    spend(led, clock)
    assert led.set_lane("c", ceiling=100, force=True).ceiling == 100
    led.submit("s", 1, "c")
    assert led.tick("c") == []
    assert any(line.startswith("I1 lane c") for line in led.audit())  # what the refusal warned of


def test_raising_it_or_changing_a_lane_with_nothing_admitted_is_never_refused(led, clock):
    lane(led)
    assert led.set_lane("c", ceiling=1).ceiling == 1
    assert led.set_lane("c", allowance=20_000, ceiling=20_000).ceiling == 20_000


def test_a_job_parked_in_a_lane_with_a_fallback_it_did_not_ask_for_is_told_how_to_ask(led, clock):
    # An outside review: a lane set with --fallback paid, a gated task without fallback=True parked anyway
    # (JobParked), its reason silent on why the fallback was not used.
    lane(led, fallback="paid")
    plain = led.submit("s", 800, "c")
    asks = led.submit("s", 800, "c", fallback=True)
    led.set_lane("c", burst_tokens=500)  # neither fits now: one moves, one is parked
    assert led.job(asks)["lane"] == "paid" and led.job(asks)["state"] == "new"
    assert led.job(plain)["state"] == "parked"
    (tail,) = led.tail("c")
    assert tail["job_id"] == plain and "exceeds the lane's burst of 500" in tail["reason"]
    assert "lane 'c' falls back to 'paid' only for jobs that ask: fallback=True" in tail["reason"]
    lane(led, fallback="")  # a lane without a fallback: nothing more to say
    led.set_lane("c", burst_tokens=10_000)
    other = led.submit("s", 800, "c")
    led.set_lane("c", burst_tokens=500)
    assert led.job(other)["state"] == "parked" and "falls back" not in led.job(other)["reason"]
