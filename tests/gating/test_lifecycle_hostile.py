"""A hostile reviewer's Prefect-lifecycle scenarios: whatever the task run's lifecycle does (a timeout at
admission, a generator abandoned half-way, retries, a lease lost mid-body, many waiters on one slot), the
ledger's own reads must agree afterwards: audit sound, reserved = Σ est of leased jobs, spent = Σ settlement
actuals, and no job left leased or waiting that nobody runs. Each runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from lane_plugin import lane_task, report_usage
from lane_plugin.gating import get_ledger, renewal, tokenlog

from ..conftest import PgSchema, postgres_or_skip
from ..tables import job_rows, settlements

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(180)]


@pytest.fixture(params=["sqlite", "postgresql"])
def led(request, tmp_path, monkeypatch):
    """The gate's ledger for this test, on each database."""
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'lane.db'}"
    else:
        schema = PgSchema(postgres_or_skip())
        url = schema.url
    monkeypatch.setenv("LANE_DATABASE_URL", url)
    ledger = get_ledger(url)
    ledger.lanes()  # migrate first: no timeout lands in the ledger's creation
    yield ledger
    ledger.close()
    if schema is not None:
        schema.drop()


def sound(ledger, *, stuck_ok: int = 0) -> None:
    """The ledger's own reads agree: audit, I2, I3 per lane, and nothing left leased or waiting."""
    assert ledger.audit() == []
    jobs, sets = job_rows(ledger), settlements(ledger)
    for lane in ledger.lanes():
        row = ledger.lane(lane["lane"])
        leased = [j for j in jobs if j["lane"] == row.name and j["state"] == "leased"]
        assert row.reserved == sum(j["est"] for j in leased), (row.name, row.reserved, leased)
        assert row.leased == len(leased), (row.name, row.leased, leased)
        assert row.spent == sum(s["actual"] for s in sets if s["lane"] == row.name), (row.name, row.spent, sets)
    stuck = [j for j in jobs if j["state"] in ("leased", "new")]
    assert len(stuck) <= stuck_ok, stuck


# -- 1. a timeout that lands as the job is admitted ---------------------------------------------------
@lane_task(stage="admit-alarm", estimate=500, timeout_seconds=1.0)
def admit_alarm():
    return {"usage": {"total_tokens": 400}}


@pytest.mark.timeout(180, method="thread")  # no SIGALRM handler of pytest's: Prefect uses its alarm
def test_a_timeout_landing_in_the_admission_log_read_leaks_no_lease(led, monkeypatch):
    """Prefect's alarm (main thread) fires while the gate logs the admission (a slow ledger read):
    the job was leased, the body never ran. Nothing may stay leased, nor be renewed forever."""
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    entered = []
    real = tokenlog.admitted

    def slow_admitted(*a, **k):  # the lane read behind the INFO line is slow: the alarm lands in it
        entered.append(time.monotonic())
        time.sleep(3.0)
        return real(*a, **k)

    monkeypatch.setattr(tokenlog, "admitted", slow_admitted)
    states = []

    @flow
    def f():
        states.append(admit_alarm(return_state=True))

    f()
    assert entered, "the admission log ran"
    assert states[0].name == "TimedOut", states[0]  # the fault happened: the alarm fired in the admission
    held = [h for h in renewal.renewer()._held if h.ledger is led]
    assert held == [], "a lease nobody will settle is renewed forever"
    [job] = job_rows(led)
    assert job["state"] != "leased", job
    assert [(x["actual"], x["outcome"]) for x in settlements(led)] == [(0, "failed")]  # the body never ran
    sound(led)


@lane_task(stage="admit-blip", estimate=500)
def admit_blip():
    return {"usage": {"total_tokens": 400}}


def test_a_lease_renewal_that_cannot_start_gives_the_lease_and_the_threads_shield_back(led, monkeypatch):
    """In a worker thread the gate holds Prefect's timeout shield from admission; the renewer's first read of
    the lane fails (a database blip). The task fails, but the lease must not stay held until it expires, and
    the worker thread must not keep the shield (every later timeout in it would be deferred for ever)."""
    from prefect._internal.concurrency.cancellation import _get_thread_shield
    from sqlalchemy.exc import OperationalError

    shields, real = [], renewal.Renewer._interval

    def blip(self, ledger, lane):
        shields.append(_get_thread_shield(threading.current_thread()))
        raise OperationalError("select lane", {}, Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(renewal.Renewer, "_interval", blip)
    states = []

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=1))
    def f():
        states.append(admit_blip.submit().wait() or None)
        fut = admit_blip.submit()
        fut.wait()
        states.append(fut.state)

    f()
    monkeypatch.setattr(renewal.Renewer, "_interval", real)
    assert shields and states[-1].is_failed(), states  # the fault happened: the renewal could not start
    assert not any(sh.active() for sh in shields), "the worker thread kept Prefect's timeout shield"
    assert all(j["state"] != "leased" for j in job_rows(led)), job_rows(led)
    sound(led)


# -- 2. a generator abandoned half-way ----------------------------------------------------------------
@lane_task(stage="gen", estimate=300)
def gen_items(n: int):
    for i in range(n):
        report_usage(100)
        yield f"item {i}"


@lane_task(stage="agen", estimate=300)
async def agen_items(n: int):
    for i in range(n):
        report_usage(100)
        yield f"item {i}"


def test_a_generator_abandoned_half_way_settles_what_it_used(led):
    @flow
    def f():
        for item in gen_items(5):
            if item == "item 1":
                break

    f()
    [job] = job_rows(led)
    assert job["state"] == "done" and job["actual"] == 200, job
    sound(led)


def test_an_async_generator_abandoned_half_way_settles_what_it_used(led):
    import asyncio

    @flow
    async def f():
        async for item in agen_items(5):
            if item == "item 1":
                break

    asyncio.run(f())
    [job] = job_rows(led)
    assert job["state"] == "done" and job["actual"] == 200, job
    sound(led)


# -- 3. retries with usage on failing attempts ---------------------------------------------------------
_calls = {"n": 0}


@lane_task(stage="flaky", estimate=500, retries=2, retry_delay_seconds=0)
def flaky():
    _calls["n"] += 1
    report_usage(300)
    if _calls["n"] < 3:
        raise RuntimeError("provider 500")
    return {"usage": {"total_tokens": 200}}


def test_retries_bill_every_failed_attempts_reported_usage(led):
    _calls["n"] = 0

    @flow
    def f():
        return flaky()

    f()
    assert _calls["n"] == 3
    sets = settlements(led)
    assert [s["actual"] for s in sets] == [300, 300, 500], sets
    assert led.lane("free").spent == 1100
    sound(led)


# -- 4. many waiters on one slot, a thread pool ----------------------------------------------------------
@lane_task(stage="mapped", estimate=100)
def mapped(x: int):
    time.sleep(0.05)
    return {"usage": {"total_tokens": 90 + x}}


def test_map_on_one_slot_settles_every_job(led):
    led.set_lane("free", max_leased=1)

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=8))
    def f():
        return mapped.map(list(range(12))).result()

    f()
    jobs = job_rows(led)
    assert len(jobs) == 12 and all(j["state"] == "done" for j in jobs)
    assert led.lane("free").spent == sum(90 + x for x in range(12))
    sound(led)


def test_a_flow_that_returns_with_tasks_still_waiting(led):
    led.set_lane("free", max_leased=1)

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=4))
    def f():
        for x in range(4):
            mapped.submit(x)  # never resolved

    f()
    time.sleep(0.5)
    sound(led)


# -- 5. a lease that expires while the body runs --------------------------------------------------------
@lane_task(stage="lost", estimate=500)
def loses_lease():
    time.sleep(1.6)  # the lease (1 s) expires: renewal is blocked
    get_ledger().reap()
    return {"usage": {"total_tokens": 650}}


def test_a_lease_lost_mid_body_is_still_billed_late(led, monkeypatch):
    led.set_lane("free", lease_seconds=1.0)
    monkeypatch.setattr(renewal.Renewer, "_renew", lambda self, held: None)  # renewal blocked

    @flow
    def f():
        return loses_lease(return_state=True)

    f()
    [s] = settlements(led)
    assert s["late"], s  # the fault happened: the lease had expired
    assert s["actual"] == 650 and led.lane("free").spent == 650
    sound(led)


# -- 6. estimate callables that raise or return nonsense ---------------------------------------------
@pytest.mark.parametrize("est", [lambda: 1 / 0, lambda: -5, lambda: "many", lambda: float("nan"), lambda: None])
def test_a_bad_estimate_is_a_clear_error_and_writes_nothing(led, est):
    t = lane_task(stage="bad-est", estimate=est)(lambda: 1)

    @flow
    def f():
        return t(return_state=True)

    state = f(return_state=True)
    assert state.is_failed()
    assert job_rows(led) == []
    sound(led)


# -- 7. the flow run is cancelled (SIGTERM -> TerminationSignal) or interrupted mid-call -------------------
_SIGNALLED: list = []  # when long_call's signal was sent (a module list: Prefect may copy a task's arguments)


@lane_task(stage="cancelled", estimate=500)
def long_call(signum: int):
    report_usage(100)  # a first call came back
    # The second LLM call: the flow run is cancelled during it. The body itself arms the signal, 0.3 s into a
    # 30 s call, so it can only land in the call: sent by a thread that watched for the lease, it could land
    # after the flow had ended (a flow failing early on a loaded machine), outside pytest.raises, and a
    # KeyboardInterrupt there crashed the test's worker (CI).
    if signal.getsignal(signum) in (signal.SIG_DFL, signal.SIG_IGN, None):
        raise RuntimeError(f"nobody turns signal {signum} into an exception here: not sending it")
    timer = threading.Timer(0.3, lambda: (_SIGNALLED.append(time.monotonic()), os.kill(os.getpid(), signum)))
    timer.start()
    try:
        time.sleep(30.0)
    finally:
        timer.cancel()  # cut short otherwise (the signal already went, or something else): never sent later
    return {"usage": {"total_tokens": 900}}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["cancel-sigterm", "ctrl-c"])
@pytest.mark.timeout(180, method="thread")
def test_a_call_cut_short_by_cancellation_bills_the_estimate(led, signum):
    """Prefect cancels a running flow run by SIGTERM, which its engine raises as TerminationSignal in the
    body; Ctrl-C raises KeyboardInterrupt. Either cuts the LLM call short like a timeout does: the provider may
    bill it, so the gate bills at least the estimate (marked by_estimate), never just what came back before."""
    if signum == signal.SIGINT and led.db.dialect == "postgresql":
        # Run in this process, this case twice killed the xdist worker in CI with no stack (stops 39 and 40): it
        # runs in a process of its own instead, with a real SIGINT from outside (tests/faults/test_ctrl_c.py).
        pytest.skip("Ctrl-C on PostgreSQL runs in a process of its own: tests/faults/test_ctrl_c.py")
    _SIGNALLED.clear()
    before = signal.signal(signal.SIGTERM, lambda *a: None)  # Prefect re-sends SIGTERM to the handler it replaced

    @flow
    def f():
        long_call(signum)

    try:
        with pytest.raises(BaseException) as got:  # noqa: B017 - TerminationSignal or KeyboardInterrupt
            f()
    finally:
        signal.signal(signal.SIGTERM, before)
    assert not isinstance(got.value, RuntimeError), got.value
    [job] = job_rows(led)
    assert _SIGNALLED and job["finished_at"] - job["admitted_at"] < 25, "the signal cut the 30 s call short"
    [s] = settlements(led)
    assert (s["actual"], bool(s["by_estimate"]), s["outcome"]) == (500, True, "failed"), s
    sound(led)


# -- 8. a timeout that lands as the job is submitted ----------------------------------------------------
@lane_task(stage="submit-alarm", estimate=500, timeout_seconds=1.0)
def submit_alarm():
    return {"usage": {"total_tokens": 400}}


@pytest.mark.timeout(180, method="thread")
def test_a_timeout_landing_just_after_the_submit_leaves_no_job_waiting_for_nobody(led, monkeypatch):
    """The alarm fires after the job's row is written, before the gate starts waiting (a slow commit)."""
    from lane_plugin.ledger import Ledger

    real, entered = Ledger.submit, []

    def slow_submit(self, *a, **k):
        job_id = real(self, *a, **k)
        entered.append(job_id)
        time.sleep(3.0)  # the commit's round trip is slow: the alarm lands here
        return job_id

    monkeypatch.setattr(Ledger, "submit", slow_submit)
    states = []

    @flow
    def f():
        states.append(submit_alarm(return_state=True))

    f()
    monkeypatch.setattr(Ledger, "submit", real)
    assert entered and states[0].name == "TimedOut", states  # the fault happened
    led.tick("free")  # a later tick must not lease it to nobody
    [job] = job_rows(led)
    assert job["state"] not in ("new", "leased"), job
    sound(led)


# -- 9. cache hits neither wait nor settle ----------------------------------------------------------------
@lane_task(stage="cached", estimate=100, cache_key_fn=lambda ctx, params: f"lc-{params['x']}")
def cached(x: str):
    return {"usage": {"total_tokens": 50}}


def test_a_cache_hit_neither_waits_nor_settles_and_refresh_cache_does(led):
    import uuid

    key = uuid.uuid4().hex

    @flow
    def f():
        cached(key)
        cached(key)  # a hit: no job
        cached.with_options(refresh_cache=True)(key)  # runs again: a job

    f()
    assert len(job_rows(led)) == 2 and led.lane("free").spent == 100
    sound(led)


# -- 10. an async body that reported more than its estimate, then timed out -------------------------------
@lane_task(stage="async-over", estimate=500, timeout_seconds=1.0)
async def async_over():
    import asyncio

    report_usage(700)
    await asyncio.sleep(3.0)
    return {"usage": {"total_tokens": 100}}


def test_an_async_timeout_after_more_than_the_estimate_bills_what_was_reported(led):
    import asyncio

    states = []

    @flow
    async def f():
        states.append(await async_over(return_state=True))

    asyncio.run(f())
    assert states[0].name == "TimedOut"
    [s] = settlements(led)
    assert (s["actual"], s["outcome"]) == (700, "failed")
    sound(led)


# -- 11. a timeout that lands between the body's return and its settlement (main thread, alarm) -------------
@lane_task(stage="exit-alarm", estimate=500, timeout_seconds=1.0)
def exit_alarm():
    return {"usage": {"total_tokens": 777}}


@pytest.mark.timeout(180, method="thread")
def test_a_timeout_landing_before_the_settlement_still_bills_what_the_body_returned(led, monkeypatch):
    """The body came back with 777 tokens; the alarm fires while the gate stops renewing its lease (the
    renewer's lock is busy). The attempt must still be settled with its 777 tokens (I5), not left leased."""
    real, entered = renewal.Renewer.release, []

    def slow_release(self, held):
        entered.append(time.monotonic())
        time.sleep(3.0)
        return real(self, held)

    monkeypatch.setattr(renewal.Renewer, "release", slow_release)
    states = []

    @flow
    def f():
        states.append(exit_alarm(return_state=True))

    f()
    monkeypatch.setattr(renewal.Renewer, "release", real)
    assert entered and states[0].name == "TimedOut", states  # the fault happened: the alarm fired in the exit
    [s] = settlements(led)
    assert s["actual"] == 777, s
    sound(led)


# -- 12. many waiters on one slot, some time out while they wait ------------------------------------------
@lane_task(stage="crowd", estimate=100, timeout_seconds=1.5)
def crowd(x: int):
    time.sleep(0.6)
    return {"usage": {"total_tokens": 100 + x}}


def test_waiters_timing_out_on_one_slot_leave_the_ledger_sound(led):
    led.set_lane("free", max_leased=1)
    states = []

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=6))
    def f():
        futs = crowd.map(list(range(6)))
        futs.wait()
        states.extend(x.state for x in futs)

    f()
    assert any(s.name == "TimedOut" for s in states), states  # the fault happened: some timed out waiting
    done = [j for j in job_rows(led) if j["state"] == "done"]
    assert led.lane("free").spent == sum(j["actual"] for j in done)
    sound(led)


# -- 13. a retry after the first attempt timed out while it waited -----------------------------------------
@lane_task(stage="retry-wait", estimate=10, lane="tight", timeout_seconds=1.0, retries=1, retry_delay_seconds=1)
def retry_wait():
    return {"usage": {"total_tokens": 9}}


def test_a_retry_after_a_wait_that_timed_out_is_admitted_and_settled_once(led):
    led.set_lane("tight", allowance=10_000, ceiling=10_000, start_fraction=1.0, max_leased=1)
    led.submit("holder", 10, "tight")
    [held] = led.tick("tight")

    def free_after_first_attempt_timed_out():
        # Not on a clock (under load Prefect may end attempt 1 well after its 1 s): the room frees once the ledger
        # shows attempt 1's wait ended (its job parked by the abandoned wait, or already resubmitted by the retry),
        # which leaves the retry's 1 s delay and its own 1 s timeout for the room to be seen.
        for _ in range(1200):
            rows = job_rows(led, "stage = 'retry-wait'")
            if rows and (rows[0]["state"] == "parked" or rows[0]["attempt"] >= 2):
                get_ledger().settle(held, 10)
                return
            time.sleep(0.05)

    threading.Thread(target=free_after_first_attempt_timed_out, daemon=True).start()
    states = []

    @flow
    def f():
        states.append(retry_wait(return_state=True))

    f()
    assert states[0].is_completed(), states
    [job] = [j for j in job_rows(led) if j["stage"] == "retry-wait"]
    assert job["state"] == "done" and job["attempt"] == 2, job  # the fault happened: attempt 1 timed out
    assert [s["actual"] for s in settlements(led) if s["job_id"] == job["id"]] == [9]
    sound(led)


# -- 14. with_options chains still gate; a rate_cost callable that raises writes nothing ----------------------
def test_with_options_chains_still_gate(led):
    t = mapped.with_options(retries=1).with_options(name="renamed", timeout_seconds=30)

    @flow
    def f():
        return t(3)

    f()
    [job] = job_rows(led)
    assert job["stage"] == "mapped" and job["actual"] == 93
    sound(led)


def test_a_raising_rate_cost_is_a_clear_error_and_writes_nothing(led):
    t = lane_task(stage="bad-rate", estimate=10, rate_cost=lambda: 1 / 0)(lambda: 1)

    @flow
    def f():
        return t()

    assert f(return_state=True).is_failed()
    assert job_rows(led) == []
    sound(led)


# -- 15. a lease lost mid-body, the body fails, Prefect retries ------------------------------------------------
_lost = {"n": 0}


@lane_task(stage="lost-retry", estimate=500, retries=1, retry_delay_seconds=0)
def lost_then_retry():
    _lost["n"] += 1
    report_usage(300)
    if _lost["n"] == 1:
        time.sleep(1.6)  # the lease (1 s) expires: renewal is blocked
        get_ledger().reap()
        raise RuntimeError("provider 500 after a long call")
    return {"usage": {"total_tokens": 100}}


def test_a_lost_lease_then_a_failed_attempt_then_a_retry_bills_both_attempts(led, monkeypatch):
    led.set_lane("free", lease_seconds=1.0)
    monkeypatch.setattr(renewal.Renewer, "_renew", lambda self, held: None)  # renewal blocked
    _lost["n"] = 0

    @flow
    def f():
        return lost_then_retry(return_state=True)

    f()
    sets = settlements(led)
    assert sets and sets[0]["late"], sets  # the fault happened: attempt 1's lease had expired
    assert [(s["attempt"], s["actual"]) for s in sets] == [(1, 300), (2, 400)], sets
    [job] = job_rows(led)
    assert job["state"] == "done", job
    sound(led)


# -- 16. async tasks gathered on one slot; one fails, the flow run ends with the others still waiting ------------
@lane_task(stage="gathered", estimate=100)
async def gathered(x: int):
    import asyncio

    await asyncio.sleep(0.3)
    if x == 0:
        raise RuntimeError("first one fails")
    return {"usage": {"total_tokens": 100 + x}}


def test_gathered_async_tasks_abandoned_when_one_fails_leave_the_ledger_sound(led):
    import asyncio

    led.set_lane("free", max_leased=1)

    @flow
    async def f():
        await asyncio.gather(*(gathered(x) for x in range(5)))

    assert asyncio.run(f(return_state=True)).is_failed()
    time.sleep(0.5)
    jobs = job_rows(led)
    assert len(jobs) >= 2 and any(j["state"] == "failed" for j in jobs), jobs  # the first failed, others waited
    sound(led)
