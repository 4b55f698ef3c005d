"""Issue 10 item 3: a due job that can no longer fit must not block its lane for ever.

Lane without a period, 400 of 1,000 spent, a 700-token job has waited past ``max_wait_seconds``:
before the fix its shadow reservation kept every 50-token job out for good (0 of 5 admitted with
600 left) and ``wait_status`` said ``blocked_by None``; a gated task with no deadline waited in
that state for ever. Checked with our own SQL on the tables, not the ledger's view of itself.
"""

from __future__ import annotations

import time

import pytest

from lane_plugin import JobParked, Ledger

from ..tables import job_rows
from .conftest import figure


def _lane(led: Ledger, **kw) -> None:
    led.set_lane(
        "t", **{**dict(allowance=1_000, ceiling=1_000, burst_tokens=1_000, max_leased=10, max_wait_seconds=60), **kw}
    )


def _spend(led: Ledger, tokens: int) -> None:
    job = led.submit("spent", tokens, "t")
    [lease] = led.tick("t")
    assert lease.job_id == job
    led.settle(lease, tokens)


def test_a_due_job_that_cannot_fit_is_parked_and_small_jobs_go(ledger_url, clock):
    events: list = []
    led = Ledger(ledger_url, clock=clock, listeners=[lambda *e: events.append(e)])
    try:
        _lane(led)
        _spend(led, 400)
        big = led.submit("big", 700, "t")
        clock.t += 120  # twice max_wait_seconds: the old policy called it due and shadowed it
        small = [led.submit("small", 50, "t") for _ in range(5)]
        status = led.wait_status(big)
        leases = led.tick("t")
        assert sorted(x.job_id for x in leases) == sorted(small)
        assert status["blocked_by"] == "ceiling" and "600 of 1000" in (status.get("reason") or "")
        _, rows = led.rows("select state, reason from job where id = :id", {"id": big})
        state, reason = rows[0]
        assert state == "parked" and "ceiling" in reason and "no period" in reason
        _, tail = led.rows("select job_id, reason from tail")
        assert tail == [(big, reason)]
        [(_, lane_name, payload)] = [e for e in events if e[0] == "lane.job.parked"]
        assert (lane_name, payload["job_id"], payload["rule"], payload["reason"]) == ("t", big, "ceiling", reason)
        _, lane = led.rows("select spent, reserved, leased from lane where name = 't'")
        assert lane == [(400, 250, 5)]
        assert led.audit() == []
        figure(
            f"unfit job ({ledger_url.split(':')[0]}): parked by the first tick; 5 of 5 small jobs admitted "
            "beside it (before the fix: 0 of 5, for ever)"
        )
    finally:
        led.close()


def test_a_fallback_lane_takes_it_instead_of_the_tail(ledger_url, clock):
    led = Ledger(ledger_url, clock=clock)
    try:
        _lane(led, fallback="paid")
        _spend(led, 400)
        big = led.submit("big", 700, "t", fallback=True)
        small = led.submit("small", 50, "t")
        assert [x.job_id for x in led.tick("t")] == [small]
        job = led.job(big)
        assert (job["lane"], job["state"]) == ("paid", "new")
        assert [x.job_id for x in led.tick("paid")] == [big]
        assert led.audit() == []
    finally:
        led.close()


def test_with_a_period_it_waits_for_the_reset_without_blocking(ledger_url, clock):
    led = Ledger(ledger_url, clock=clock)
    try:
        clock.t = 1_800_000_000.0 - 1_800_000_000.0 % 86_400 + 3_600  # 01:00 UTC
        _lane(led, period="daily")
        _spend(led, 400)
        big = led.submit("big", 700, "t")
        clock.t += 120
        small = [led.submit("small", 50, "t") for _ in range(5)]
        assert sorted(x.job_id for x in led.tick("t")) == sorted(small)
        assert led.job(big)["state"] == "new" and "period resets" in led.wait_status(big)["reason"]
        clock.t += 86_400  # the next day: spend resets and it goes
        assert [x.job_id for x in led.tick("t")] == [big]
        assert led.audit(grace=10**6) == []
    finally:
        led.close()


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.timeout(90)
def test_a_gated_task_without_deadline_gets_jobparked_with_the_reason(ledger):
    from prefect import flow

    from lane_plugin import lane_task

    _lane(ledger)
    _spend(ledger, 400)

    @lane_task(stage="big", estimate=700, lane="t")  # no deadline
    def big_call():
        return 700

    @flow
    def f():
        return big_call()

    t0 = time.monotonic()
    state = f(return_state=True)
    with pytest.raises(JobParked, match=r"estimate 700 exceeds what is left of the ceiling: 600 of 1000"):
        state.result()
    waited = time.monotonic() - t0
    [job] = job_rows(ledger, "stage = 'big'")
    assert job["state"] == "parked" and job["attempt"] == 1
    assert ledger.audit() == []
    figure(f"unfit gated task without deadline: JobParked after {waited:.1f} s (before the fix: waited for ever)")
