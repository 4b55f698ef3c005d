"""Drift that cannot lie (issue 12 item 5): what a sum of 1.0 hides is shown, and never called honest."""

from __future__ import annotations

import pytest

from lane_plugin import Ledger
from lane_plugin.reports import drift
from lane_plugin.reports.drift import verdict
from lane_plugin.reports.summary import advice


@pytest.fixture
def led(sqlite_url):
    ledger = Ledger(sqlite_url)
    ledger.set_lane("r", allowance=10**9, ceiling=10**9, burst_tokens=10**8, max_leased=1000)
    yield ledger
    ledger.close()


def settle(led, stage, est, actual, *, by_estimate=False, rate_cost=None):
    jid = led.submit(stage, est, "r", rate_cost=rate_cost)
    [lease] = [x for x in led.tick("r") if x.job_id == jid]
    led.settle(lease, actual, by_estimate=by_estimate)


def rows(led):
    return {r["stage"]: r for r in drift(led, lane="r").to_dict("records")}


def test_a_sum_of_one_over_errors_both_ways_is_two_sided_not_honest(led):
    for i in range(50):  # a constant 1,000 against actuals of 400 and 1,600: drift 1.00, 30% beyond
        settle(led, "constant", 1_000, 400 if i % 2 else 1_600)
        settle(led, "tight", 1_000, 990 if i % 2 else 1_010)
    r = rows(led)
    c, t = r["constant"], r["tight"]
    assert c["drift"] == 1.0 and c["verdict"] == "two-sided"
    assert (c["under"], c["overspend"], c["p99"]) == (0.5, 0.3, 1.6)
    assert t["verdict"] == "honest" and t["overspend"] < 0.01
    assert "hides errors both ways" in advice(c) and "learned()" in advice(c)


def test_a_stage_billed_by_estimate_is_never_honest(led):
    for _ in range(9):
        settle(led, "s", 1_000, 1_010)
    settle(led, "s", 1_000, 1_000, by_estimate=True)
    s = rows(led)["s"]
    assert s["by_estimate"] == 1 and s["verdict"] == "billed by estimate"
    assert "report_usage" in advice(s)


def test_low_drift_advice_never_says_lower_the_rate_cost(led):
    for _ in range(10):
        settle(led, "padded", 3_000, 1_000, rate_cost=3_000)  # rate_cost = est: no rate_cost of its own
        settle(led, "rated", 3_000, 1_000, rate_cost=5_000)  # prompt + max_tokens, counted by the limiter
    r = rows(led)
    assert (r["padded"]["rate_cost_set"], r["rated"]["rate_cost_set"]) == (False, True)
    rated = advice(r["rated"])
    assert "leave `rate_cost` as it is" in rated and "lower the rate_cost" not in rated.lower()
    assert "pass that as `rate_cost=` first" in advice(r["padded"])


def test_verdict_keeps_its_old_answers_without_the_new_figures():
    assert verdict(1.0) == "honest" and verdict(1.51) == "overspends" and verdict(0.5) == "wastes room"
    assert verdict(1.6, by_estimate=2) == "overspends"
