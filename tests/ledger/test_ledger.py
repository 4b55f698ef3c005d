"""The store suite: the same behaviour on SQLite and PostgreSQL (parametrised ``ledger_url``)."""

from __future__ import annotations

import pytest

from lane_plugin import (
    ConflictingReplay,
    InvalidInput,
    JobParked,
    LaneError,
    LeaseLost,
    Ledger,
    NeverFits,
    NotLeased,
    UnknownJob,
    UnknownLane,
)
from lane_plugin.reports import drift

from ..tables import ARTICLE_SQL


def small_lane(led, **kw):
    settings = dict(
        allowance=10_000,
        ceiling=1_000,
        start_fraction=1.0,
        burst_tokens=1_000,
        max_leased=10,
        lease_seconds=30,
        max_attempts=2,
        max_wait_seconds=600,
    )
    settings.update(kw)
    return led.set_lane("t", **settings)


def counts(led):
    cols, rows = led.rows(
        "select (select count(*) from job), (select count(*) from settlement), "
        "(select count(*) from tail), (select spent from lane where name='free'), "
        "(select reserved from lane where name='free')"
    )
    return rows[0]


def test_fresh_ledger_has_free_and_paid_lanes_with_the_documented_defaults(led):
    lanes = {s["lane"]: s for s in led.lanes()}
    free = lanes["free"]
    # start_fraction 1.0: no flat stop; the finishing reserve keeps what runs under way need
    assert (free["allowance"], free["ceiling"], free["start_limit"]) == (10_000_000, 8_000_000, 8_000_000)
    assert (free["rate_basis"], free["finishing"], free["window_used"]) == ("request", 0, 0)
    assert (free["burst_tokens"], free["window_seconds"], free["max_leased"], free["lease_seconds"]) == (
        40_000,
        1.0,
        25,
        90.0,
    )
    assert "paid" in lanes
    assert led.audit() == []


def test_submit_tick_settle_moves_the_counters(led):
    a = led.submit("draft", 300)
    b = led.submit("draft", 100)
    leases = led.tick()
    assert [x.job_id for x in leases] == [b, a]  # smallest first
    free = led.lane("free")
    assert (free.reserved, free.leased) == (400, 2)
    r = led.settle(leases[0], 120)
    assert (r.actual, r.overage, r.late, r.replay) == (120, 20, False, False)
    free = led.lane("free")
    assert (free.spent, free.reserved, free.leased, free.overage) == (120, 300, 1, 20)
    assert led.job(b)["state"] == "done" and led.job(b)["actual"] == 120
    assert led.audit() == []


def test_jobs_that_each_fit_cannot_together_overspend(led):
    """The article's tick never subtracted admitted weight: ours counts reserved estimates."""
    small_lane(led)
    for _ in range(5):
        led.submit("s", 300, "t")
    assert len(led.tick("t")) == 3
    assert led.tick("t") == []  # 900 reserved: a fourth 300 would pass 1,000
    assert led.lane("t").reserved == 900
    assert led.audit() == []


def test_burst_window_caps_tokens_per_window_then_refills(led, clock):
    small_lane(led, burst_tokens=500, ceiling=5_000, allowance=5_000)
    for _ in range(4):
        led.submit("s", 200, "t")
    assert len(led.tick("t")) == 2
    assert led.tick("t") == []
    clock.t += 1.0
    assert len(led.tick("t")) == 2


def test_lease_cap(led):
    small_lane(led, max_leased=2)
    for _ in range(4):
        led.submit("s", 10, "t")
    assert len(led.tick("t")) == 2
    assert led.tick("t") == []


def test_settlement_is_idempotent_and_a_replay_bills_nothing(led):
    led.submit("s", 100)
    [lease] = led.tick()
    first = led.settle(lease, 90)
    again = led.settle(lease, 90)
    assert again.replay and again.actual == 90 and again.attempt == 1
    with pytest.raises(ConflictingReplay, match="already settled with 90 tokens; this settlement says 5000"):
        led.settle(lease, 5000)  # not a replay: another actual (issue 10 item 2)
    free = led.lane("free")
    assert free.spent == 90 and free.reserved == 0
    cols, rows = led.rows("select count(*) from settlement")
    assert rows[0][0] == 1
    assert first.replay is False
    assert led.audit() == []


def test_actual_above_estimate_is_billed_and_counted_as_overage(led):
    led.submit("s", 100)
    [lease] = led.tick()
    r = led.settle(lease, 250)
    assert r.overage == 150
    assert led.lane("free").overage == 150 and led.lane("free").spent == 250
    assert led.audit() == []


def test_expired_lease_is_reaped_then_a_late_settlement_is_still_billed(led, clock):
    small_lane(led)
    jid = led.submit("s", 200, "t")
    [first] = led.tick("t")
    clock.t += 31
    moved = led.reap()
    assert moved.requeued == [jid]
    job = led.job(jid)
    assert (job["state"], job["attempt"]) == ("new", 2)
    assert led.lane("t").reserved == 0
    with pytest.raises(LeaseLost):
        led.renew(jid, first.token)
    [second] = led.tick("t")
    assert second.attempt == 2
    late = led.settle(first, 180)  # the zombie's tokens were really spent
    assert late.late and late.overage == 180
    on_time = led.settle(second, 150)
    assert not on_time.late
    t = led.lane("t")
    assert (t.spent, t.reserved, t.overage) == (330, 0, 180)
    assert led.job(jid)["actual"] == 330
    assert led.audit() == []


def test_exhausted_attempts_park_the_job_with_a_deadline(led, clock):
    small_lane(led, max_attempts=2)
    jid = led.submit("s", 200, "t")
    for _ in range(2):
        assert led.tick("t")
        clock.t += 31
        led.reap()
    job = led.job(jid)
    assert job["state"] == "parked" and "lease expired" in job["reason"]
    [tail] = led.tail()
    assert tail["job_id"] == jid and tail["deadline"] > clock.t
    with pytest.raises(JobParked, match="parked"):
        led.acquire(jid)
    led.requeue(jid)
    assert led.job(jid)["state"] == "new" and led.job(jid)["attempt"] == 3
    assert led.tail() == []
    assert led.audit() == []


def test_renew_extends_a_held_lease(led, clock):
    led.submit("s", 10)
    [lease] = led.tick()
    clock.t += 60
    assert led.renew(lease.job_id, lease.token) == clock.t + 90
    clock.t += 60  # past the first expiry, not the renewed one
    assert led.reap().requeued == []


def test_idempotent_submit_and_retry_attempts(led):
    a = led.submit("s", 100, key="task-run-1")
    assert led.submit("s", 100, key="task-run-1") == a
    with pytest.raises(ConflictingReplay, match="estimate 100"):
        led.submit("s", 101, key="task-run-1")
    [lease] = led.tick()
    # a retry (attempt 2) voids the crashed attempt's lease and waits again
    assert led.submit("s", 100, key="task-run-1", attempt=2) == a
    job = led.job(a)
    assert (job["state"], job["attempt"]) == ("new", 2)
    assert led.lane("free").reserved == 0
    [again] = led.tick()
    assert again.attempt == 2
    led.settle(again, 80)
    late = led.settle(lease, 40)  # the first attempt did spend: billed, late
    assert late.late
    cols, rows = led.rows("select count(*) from job")
    assert rows[0][0] == 1
    assert led.audit() == []


def test_a_job_that_can_never_fit_is_refused_or_routed_to_the_fallback(led):
    before = counts(led)
    with pytest.raises(NeverFits, match="burst of 40000"):
        led.submit("big", 50_000)
    assert counts(led) == before
    jid = led.submit("big", 50_000, fallback="paid")
    assert led.job(jid)["lane"] == "paid"
    led.set_lane("free", fallback="paid")
    jid = led.submit("big", 60_000, fallback=True)
    assert led.job(jid)["lane"] == "paid"


@pytest.mark.parametrize("field", ["fallback", "preflight"])
@pytest.mark.parametrize("value", ["\ud800", "a\x00b", "x" * 5000])
def test_a_lane_setting_that_is_not_storable_text_is_refused_naming_it(led, field, value):
    # a lone surrogate reached the database driver as a UnicodeEncodeError (the hostile-input run found it)
    before = counts(led)
    with pytest.raises(InvalidInput) as err:
        led.set_lane("free", **{field: value})
    assert err.value.field == field and counts(led) == before
    assert getattr(led.lane("free"), field) is None


def test_the_eighty_percent_rule_lets_started_runs_finish(led):
    small_lane(led, start_fraction=0.8)
    led.submit("draft", 500, "t", run_key="run-1")
    [a] = led.tick("t")
    led.settle(a, 500)
    new_run = led.submit("draft", 400, "t", run_key="run-2")
    later_stage = led.submit("final", 400, "t", run_key="run-1")
    leases = led.tick("t")
    assert [x.job_id for x in leases] == [later_stage]
    # 500 spent + 400 > the 800 start limit, and spend only grows: without a period it can never start
    job = led.job(new_run)
    assert job["state"] == "parked" and "start limit 800" in job["reason"]


def test_past_the_start_limit_later_stages_behind_many_starters_still_finish(led):
    small_lane(led, start_fraction=0.8, max_leased=5)
    led.submit("draft", 795, "t", run_key="run-1")
    [a] = led.tick("t")
    led.settle(a, 795)
    for i in range(30):  # small jobs of new runs fill the head of the index
        led.submit("draft", 10 + i, "t", run_key=f"new-{i}")
    later = led.submit("final", 200, "t", run_key="run-1")
    assert [x.job_id for x in led.tick("t")] == [later]
    assert led.audit() == []


@pytest.fixture
def down_check():
    """A check registered in code (a lane row names it; it never names code)."""
    from lane_plugin import register_preflight, unregister_preflight

    from . import preflight_checks

    register_preflight("store-test-down", preflight_checks.down)
    yield "store-test-down"
    unregister_preflight("store-test-down")


def test_preflight_failure_stops_the_lane_and_sends_fallback_jobs_on(led, down_check):
    small_lane(led, preflight=down_check, fallback="paid")
    stay = led.submit("s", 10, "t")
    go = led.submit("s", 10, "t", fallback=True)
    assert led.tick("t") == []
    status = {s["lane"]: s for s in led.lanes()}["t"]
    assert status["preflight_ok"] is False or status["preflight_ok"] == 0
    assert "returned False" in status["preflight_error"]
    assert led.job(stay)["lane"] == "t"
    assert led.job(go)["lane"] == "paid"
    assert [x.job_id for x in led.tick("paid")] == [go]


def test_preflight_spec_is_validated(led):
    with pytest.raises(InvalidInput, match="preflight"):
        led.set_lane("free", preflight="not a url or callable")
    with pytest.raises(InvalidInput, match="preflight"):
        led.set_lane("free", preflight="http://[bad")
    with pytest.raises(InvalidInput, match="no preflight check named 'tests.ledger.preflight_checks:up'"):
        led.set_lane("free", preflight="tests.ledger.preflight_checks:up")  # importable, but not registered


@pytest.mark.parametrize("stage", ["it's", 'say "hi"', "ünïcödé ✓ 草", "'); drop table job; --", "a%sb%(x)s"])
def test_stage_names_are_data(led, stage):
    jid = led.submit(stage, 100)
    [lease] = led.tick()
    led.settle(lease, 100)
    assert led.job(jid)["stage"] == stage
    assert list(drift(led)["stage"]) == [stage]


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda led: led.submit("s", 0), "est"),
        (lambda led: led.submit("s", -5), "est"),
        (lambda led: led.submit("s", 1.5), "est"),
        (lambda led: led.submit("s", float("nan")), "est"),
        (lambda led: led.submit("s", "12"), "est"),
        (lambda led: led.submit("s", 10**13), "est"),
        (lambda led: led.submit("", 10), "stage"),
        (lambda led: led.submit("x" * 10_000, 10), "stage"),
        (lambda led: led.submit("a\x00b", 10), "stage"),
        (lambda led: led.settle("nope", 10), None),
        (lambda led: led.settle(led.submit("s", 10), 10), None),
        (lambda led: led.set_lane("free", ceiling=-1), "ceiling"),
        (lambda led: led.set_lane("free", ceiling=20_000_000), "ceiling"),
        (lambda led: led.set_lane("free", start_fraction=1.5), "start_fraction"),
        (lambda led: led.set_lane("free", colour="red"), "lane setting"),
        (lambda led: led.tick("nope"), None),
    ],
)
def test_bad_input_is_refused_clearly_and_writes_nothing(led, call, field):
    led.submit("s", 100)
    before = counts(led)
    with pytest.raises(LaneError) as err:
        call(led)
    if field:
        assert isinstance(err.value, InvalidInput) and err.value.field == field
        assert str(err.value).startswith(f"invalid {field}")
    after = counts(led)
    # the never-leased settle submits one job first; nothing else moved
    assert after[1:] == before[1:]
    assert led.audit() == []


def test_negative_actual_and_unknown_things(led):
    led.submit("s", 10)
    [lease] = led.tick()
    with pytest.raises(InvalidInput, match="actual"):
        led.settle(lease, -1)
    with pytest.raises(UnknownJob):
        led.job("missing")
    with pytest.raises(UnknownLane):
        led.submit("s", 10, "nolane")
    with pytest.raises(NotLeased, match="never leased"):
        led.settle(lease, 5, attempt=2)


def test_park_overdue_parks_waiting_jobs_past_their_deadline_once(led, clock):
    small_lane(led, ceiling=100, allowance=100, park_seconds=60)
    jid = led.submit("s", 90, "t", wait_seconds=10)
    led.submit("s", 50, "t")  # no deadline: waits
    led.set_lane("t", stopped=True)
    clock.t += 11
    first = led.park_overdue()
    second = led.park_overdue()
    assert [p["job_id"] for p in first.parked] == [jid]
    assert second.parked == []
    assert {s["lane"]: s for s in led.lanes()}["t"]["parked"] == 1
    clock.t += 61
    expired = led.park_overdue()
    assert [e["job_id"] for e in expired.expired] == [jid]
    assert led.job(jid)["state"] == "failed"
    assert led.audit() == []


def test_give_up_waiting_moves_to_the_fallback_or_parks(led):
    small_lane(led, fallback="paid")
    a = led.submit("s", 10, "t", fallback=True)
    b = led.submit("s", 10, "t")
    assert led.give_up_waiting(a, "deadline") == "paid"
    assert led.give_up_waiting(b, "deadline passed") is None
    assert led.job(b)["state"] == "parked"
    with pytest.raises(JobParked, match="lane 't'"):
        led.acquire(b)
    assert led.audit() == []


def test_a_job_that_falls_back_gets_its_wait_again_in_the_fallback_lane(led, clock):
    small_lane(led, fallback="paid")
    jid = led.submit("s", 10, "t", fallback=True, wait_seconds=10)
    clock.t += 11
    assert led.give_up_waiting(jid, "deadline") == "paid"
    assert led.job(jid)["deadline"] == clock.t + 10
    led.set_lane("paid", stopped=True)
    assert led.park_overdue().parked == []  # not parked for the deadline it missed in lane t
    clock.t += 11
    assert [p["job_id"] for p in led.park_overdue().parked] == [jid]
    assert led.audit() == []


def test_drop_fails_a_parked_job(led):
    jid = led.submit("s", 10)
    led.park(jid, "operator")
    led.drop(jid)
    assert led.job(jid)["state"] == "failed" and led.tail() == []
    with pytest.raises(LaneError, match="not parked"):
        led.drop(jid)


def test_daily_period_resets_spent(led, clock):
    small_lane(led, period="daily")
    led.submit("s", 100, "t")
    [lease] = led.tick("t")
    led.settle(lease, 100)
    assert led.lane("t").spent == 100
    clock.t += 86_400
    led.tick("t")
    assert led.lane("t").spent == 0
    assert led.audit() == []


def test_the_articles_drift_sql_runs_verbatim_and_agrees_with_the_report(led):
    import random

    rnd = random.Random(7)
    for stage in ("draft", "critique"):
        for _ in range(12):
            led.submit(stage, rnd.randint(100, 900))
    for _ in range(10):
        for lease in led.tick():
            led.settle(lease, int(lease.est * (1.8 if lease.stage == "critique" else 1.0) * rnd.uniform(0.8, 1.2)))
        led.clock.t += 1
    cols, rows = led.rows(ARTICLE_SQL)
    article = {r[0]: (r[1], r[2], r[3], float(r[4])) for r in rows}
    ours = {
        r["stage"]: (r["jobs"], r["est_tokens"], r["actual_tokens"], r["drift"]) for r in drift(led).to_dict("records")
    }
    assert article == ours
    assert ours["critique"][3] > 1.5


def test_aging_admits_a_big_job_that_waited_past_max_wait(led, clock):
    small_lane(led, ceiling=1_000, allowance=1_000, max_wait_seconds=60, burst_tokens=1_000)
    big = led.submit("big", 600, "t")
    clock.t += 1
    for _ in range(3):
        led.submit("small", 200, "t")
    leases = led.tick("t")
    assert big not in [x.job_id for x in leases]  # not yet due: smallest first
    for x in leases:
        led.settle(x, x.est)
    led.set_lane("t", ceiling=10_000, allowance=10_000)
    clock.t += 61
    for _ in range(10):
        led.submit("small", 200, "t")
    clock.t += 1
    assert led.tick("t")[0].job_id == big


@pytest.fixture
def http_status():
    """A loopback HTTP server whose answer the test sets."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    state = {"code": 200}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(state["code"])
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/health"
    yield state
    server.shutdown()


def test_http_preflight_must_answer_2xx(led, http_status):
    small_lane(led, preflight=http_status["url"], preflight_timeout=2.0)
    led.preflight.ttl = 0  # check on every tick for this test
    led.submit("s", 10, "t")
    http_status["code"] = 503
    assert led.tick("t") == []
    status = {s["lane"]: s for s in led.lanes()}["t"]
    assert not status["preflight_ok"] and "HTTP 503" in status["preflight_error"]
    http_status["code"] = 204
    assert len(led.tick("t")) == 1
    assert {s["lane"]: s for s in led.lanes()}["t"]["preflight_ok"]


def test_two_callers_creating_the_same_lane_at_once_both_succeed(ledger_url):
    import threading

    errors, barrier = [], threading.Barrier(4)

    def create(i):
        led = Ledger(ledger_url)
        barrier.wait()
        try:
            led.set_lane("racy", ceiling=1_000 + i, allowance=10_000)
        except Exception as exc:  # noqa: BLE001 - the assertion below names it
            errors.append(exc)
        finally:
            led.close()

    Ledger(ledger_url).upgrade()
    threads = [threading.Thread(target=create, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert 1_000 <= Ledger(ledger_url).lane("racy").ceiling <= 1_003
