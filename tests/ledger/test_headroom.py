"""Issue 12 item 3 in the store, on SQLite and PostgreSQL: the spread in flight (reserved_var) moves
with reserved in every writer, admission keeps its headroom, and the audit checks it."""

from __future__ import annotations

import pytest

from lane_plugin import InvalidInput, NeverFits
from lane_plugin.estimators import learned
from lane_plugin.gating.estimates import resolve_parts


def lane(led, **kw):
    settings = dict(
        allowance=10_000,
        ceiling=10_000,
        burst_tokens=10_000,
        window_seconds=1.0,
        max_leased=10,
        lease_seconds=30.0,
        headroom_sigmas=2.0,
    )
    return led.set_lane("h", **{**settings, **kw})


def counters(led) -> tuple[int, int]:
    """``(lane.reserved_var, sum of est_var of its leased jobs)`` read with our own SQL."""
    _, [(var, leased)] = led.rows(
        "select reserved_var, (select coalesce(sum(est_var), 0) from job "
        "where lane = 'h' and state = 'leased') from lane where name = 'h'"
    )
    return var, leased


def test_reserved_var_moves_with_tick_settle_reap_and_reopen(led, clock):
    lane(led)
    a = led.submit("s", 1_000, "h", est_var=40_000)
    b = led.submit("s", 1_000, "h", est_var=10_000, key="k-b")
    assert {x.job_id for x in led.tick("h")} == {a, b}
    assert counters(led) == (50_000, 50_000)
    led.settle(a, 1_100)
    assert counters(led) == (10_000, 10_000)
    led.submit("s", 1_000, "h", est_var=10_000, key="k-b", attempt=2)  # a retry voids the held lease
    assert counters(led) == (0, 0)
    [lease] = led.tick("h")
    assert counters(led) == (10_000, 10_000)
    clock.t += 60  # the lease expires and is reaped back to the queue
    led.reap()
    assert counters(led) == (0, 0)
    assert led.audit() == []
    assert lease.job_id == b


def test_admission_keeps_headroom_for_the_spread_in_flight(led):
    lane(led)
    big = led.submit("s", 8_800, "h", est_var=100**2)  # sd 100: 200 tokens of headroom
    assert [x.job_id for x in led.tick("h")] == [big]
    [status] = [x for x in led.lanes() if x["lane"] == "h"]
    assert (status["reserved_var"], status["headroom"]) == (10_000, 200)
    small = led.submit("s", 1_000, "h", est_var=100**2)  # fits by its mean (9,800), not with 2 * 141 = 283 more
    assert led.tick("h") == []
    assert led.wait_status(small)["blocked_by"] == "headroom"
    led.set_lane("h", headroom_sigmas=0.0)  # the operator's choice: no headroom, the old rule
    assert [x.job_id for x in led.tick("h")] == [small]
    assert led.audit() == []


def test_bad_input_names_the_field(led):
    lane(led)
    with pytest.raises(InvalidInput, match="est_var"):
        led.submit("s", 100, "h", est_var=-1)
    with pytest.raises(InvalidInput, match="headroom_sigmas"):
        led.set_lane("h", headroom_sigmas=-0.5)
    with pytest.raises(NeverFits, match="headroom"):
        led.submit("s", 9_900, "h", est_var=200**2)  # 9,900 + 400 can never fit a ceiling of 10,000


def test_a_learned_estimate_carries_its_stage_spread_to_the_gate():
    est = learned(encoding="o200k_base", ledger=False, min_jobs=3)
    for out in (100, 300, 200):
        est.observe("critique", 1_000, 1_000 + out)
    total, version, est_input, est_var = resolve_parts(est, "critique", (), {"input_tokens": 500})
    assert (total, est_input, est_var) == (700, 500, 10_000)  # mean 200, sample variance 10,000
    assert version.startswith("learned(")


def test_submit_kwargs_carries_the_admitting_learned_spread(led):
    from lane_plugin.estimators import Constant, submit_kwargs

    lane(led)
    est = learned(encoding="o200k_base", ledger=False, min_jobs=3)
    for out in (100, 300, 200):
        est.observe("draft", 1_000, 1_000 + out)
    kw = submit_kwargs(est, [Constant({"draft": 900})], input_tokens=500, stage="draft")
    assert (kw["est"], kw["est_input"], kw["est_var"]) == (700, 500, 10_000)
    assert "est_var" not in submit_kwargs(Constant({"draft": 900}), [est], input_tokens=500, stage="draft")
    jid = led.submit("draft", **kw)
    assert led.job(jid)["est_var"] == 10_000
