"""What the gate bills when the usage it read cannot be billed as it is, on SQLite and PostgreSQL.

* Usage past 10**12 (checks.MAX_TOKENS): ``Ledger.settle`` refuses it (InvalidInput naming ``actual``,
  nothing written). The gate used to pass it on after the body ran: the refusal escaped, the attempt
  stayed unbilled and its lease held ``reserved`` until reaped; later it replaced the whole sum with the
  estimate, dropping what was validly reported. Now the report that would take the block past 10**12 is
  refused where it is given (a warning naming the value) and the block bills what was validly reported,
  or the estimate if more, ``by_estimate``: settled exactly once.
* A malformed usage count (NaN, negative...): refused, the estimate is billed (or what was read
  validly, if more), ``by_estimate``.
"""

from __future__ import annotations

import logging
import math

import pytest

from lane_plugin import Ledger, gate
from lane_plugin.checks import MAX_TOKENS
from lane_plugin.errors import InvalidInput, UsageMissing

from ..tables import job_rows, settlements

EST = 10


@pytest.fixture
def led(ledger_url):
    ledger = Ledger(ledger_url)
    ledger.set_lane("o", allowance=10_000, ceiling=10_000)
    yield ledger
    ledger.close()


def _billed_once(led, actual: int, outcome: str, *, by_estimate: bool) -> None:
    [job] = job_rows(led)
    [s] = settlements(led)
    assert (job["state"], job["actual"], job["attempt"]) == (outcome, actual, 1), job
    assert (s["actual"], bool(s["by_estimate"]), s["attempt"]) == (actual, by_estimate, 1), s
    lane = led.lane("o")
    assert (lane.spent, lane.reserved) == (actual, 0)
    assert led.audit() == []
    again = led.settle(job["id"], actual, attempt=1, outcome=outcome)  # the gate's settlement, replayed
    assert again.replay and led.lane("o").spent == actual and len(settlements(led)) == 1


def _warned(caplog, *parts: str) -> None:
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(all(p in w for p in parts) for w in said), said


@pytest.mark.parametrize(
    "reports, billed, named",
    [
        ([10**13], EST, "invalid usage 10000000000000: absurdly large"),
        ([MAX_TOKENS + 1], EST, "invalid usage 1000000000001: absurdly large"),
        ([6 * 10**11, 6 * 10**11], 6 * 10**11, "would bring the block's total to 1,200,000,000,000 tokens"),
    ],
    ids=["1e13", "max+1", "sum"],
)
def test_usage_past_max_tokens_is_refused_at_its_report_and_billed_once(led, caplog, reports, billed, named):
    # refused where it is given: what was validly reported before stays (the sum: its first half)
    with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"):
        with gate(stage="huge", estimate=EST, lane="o", ledger=led) as g:
            for n in reports:
                g.report(n)
    assert (g.settled.actual, g.settled.by_estimate, g.settled.outcome) == (billed, True, "done")
    _billed_once(led, billed, "done", by_estimate=True)
    _warned(caplog, named, "(from report_usage())", "not counted")


def test_usage_past_max_tokens_in_a_failing_body_bills_the_estimate_and_keeps_the_error(led, caplog):
    with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"), pytest.raises(RuntimeError, match="boom"):
        with gate(stage="huge", estimate=EST, lane="o", ledger=led) as g:
            g.report(10**13)
            raise RuntimeError("boom")
    _billed_once(led, EST, "failed", by_estimate=True)
    _warned(caplog, "invalid usage 10000000000000")


def test_the_api_refuses_an_absurd_actual_naming_it_and_writes_nothing(led):
    led.submit("s", EST, "o")
    [lease] = led.tick("o")
    with pytest.raises(InvalidInput, match=r"invalid actual 1000000000001: absurdly large"):
        led.settle(lease, MAX_TOKENS + 1)
    [job] = job_rows(led)
    assert job["state"] == "leased" and settlements(led) == [] and led.lane("o").reserved == EST
    assert led.settle(lease, 7).actual == 7 and led.audit() == []


@pytest.mark.parametrize(
    "usage", [{"prompt_tokens": -5, "completion_tokens": 20}, {"input_tokens": math.nan, "output_tokens": 10}]
)
def test_a_malformed_count_bills_the_estimate_not_the_rest_of_the_block(led, caplog, usage):
    with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"):
        with gate(stage="bad", estimate=100, lane="o", ledger=led) as g:
            g.report_result({"usage": usage})
    _billed_once(led, 100, "done", by_estimate=True)
    _warned(caplog, "invalid", "not counted")
    _warned(caplog, "had usage refused (warned above); billing 100 tokens")


@pytest.mark.parametrize("est, billed", [(100, 100), (10, 30)])
def test_malformed_usage_beside_valid_usage_bills_the_estimate_or_more(led, est, billed):
    with gate(stage="mixed", estimate=est, lane="o", ledger=led) as g:
        g.report(30)
        g.report({"usage": {"input_tokens": math.nan, "output_tokens": 10}})
    _billed_once(led, billed, "done", by_estimate=True)


def test_a_usage_reader_returning_a_malformed_block_bills_the_estimate(led):
    with gate(stage="reader", estimate=100, lane="o", ledger=led) as g:
        g.report_result({"meta": {"prompt_tokens": -5, "completion_tokens": 20}}, lambda r: r["meta"])
    _billed_once(led, 100, "done", by_estimate=True)


def test_a_malformed_count_under_missing_usage_fail_fails_billing_the_estimate(led):
    with pytest.raises(UsageMissing):
        with gate(stage="strict", estimate=100, lane="o", ledger=led, missing_usage="fail") as g:
            g.report_result({"usage": {"total_tokens": -1}})
    _billed_once(led, 100, "failed", by_estimate=True)


@pytest.mark.parametrize("est, billed", [(100, 100), (10, 30)])
def test_a_failing_body_with_a_malformed_count_bills_the_estimate_or_more_and_keeps_the_error(led, caplog, est, billed):
    # a failed body bills what was reported; with a malformed count that is known to be short (it billed 30 of
    # an estimate of 100 before): as on success, at least the estimate, by_estimate
    with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"), pytest.raises(RuntimeError, match="boom"):
        with gate(stage="mixed", estimate=est, lane="o", ledger=led) as g:
            g.report(30)
            g.report({"usage": {"prompt_tokens": -5, "completion_tokens": 20}})
            raise RuntimeError("boom")
    _billed_once(led, billed, "failed", by_estimate=True)
    _warned(caplog, "invalid prompt_tokens -5")


def test_a_failing_body_with_valid_usage_bills_what_was_reported(led):
    with pytest.raises(RuntimeError, match="boom"), gate(stage="ok", estimate=100, lane="o", ledger=led) as g:
        g.report(30)
        raise RuntimeError("boom")
    _billed_once(led, 30, "failed", by_estimate=False)
