"""Prefect's ``timeout_seconds`` and the ledger: tokens an attempt spent are billed, never lost.

How Prefect enforces a sync task's timeout decides what can be saved:

* in a worker thread (a task runner, or the main thread while another SIGALRM
  handler is installed, as pytest-timeout's is), it injects an exception at the
  next bytecode after the blocking call returns: the LLM response has arrived
  and would be thrown away. The gate defers the exception until the attempt is
  settled with that response's usage; the task run still ends timed out;
* in the main thread it interrupts the call with SIGALRM (and an async task's
  call is cancelled): no usage ever comes back, and the provider may bill the
  interrupted call, so the gate bills the estimate, marked ``by_estimate``.

Either way the settlement transaction itself is shielded: a timeout landing in
it must not roll it back and leave the attempt leased and unbilled.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest
from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from lane_plugin import lane_task
from lane_plugin.ledger import settlement as settlement_module

from ..tables import job_rows, settlements

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(120)]

# Prefect's timeout covers admission too: a loaded CI machine once took over a second to admit, and
# a 1-second timeout then fired before the body ran. The bodies below outlast this by their margins.
TIMEOUT = 3.0


@lane_task(stage="slow", estimate=500, timeout_seconds=TIMEOUT)
def slow(delay: float):
    time.sleep(delay)  # the LLM call: it comes back after the timeout, with its usage
    return {"usage": {"total_tokens": 777}}


@lane_task(stage="slow-async", estimate=500, timeout_seconds=TIMEOUT)
async def slow_async(delay: float):
    await asyncio.sleep(delay)
    return {"usage": {"total_tokens": 777}}


def _run_in_worker_thread(delay: float):
    states = []

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=2))
    def f():
        fut = slow.submit(delay)
        fut.wait()
        states.append(fut.state)

    f()
    return states[0]


def _only_job(ledger) -> tuple[dict, dict]:
    [job] = job_rows(ledger)
    [s] = settlements(ledger)
    return job, s


def test_usage_returned_after_the_timeout_in_a_worker_thread_is_billed(ledger):
    ledger.lanes()  # migrate first: the timeout must not land in the ledger's creation

    state = _run_in_worker_thread(TIMEOUT + 1.0)
    assert state.name == "TimedOut"
    job, s = _only_job(ledger)
    assert (s["actual"], bool(s["by_estimate"]), job["actual"]) == (777, False, 777)
    assert ledger.lane("free").spent == 777 and ledger.lane("free").reserved == 0
    assert ledger.audit() == []


def test_a_timeout_landing_in_the_settlement_does_not_leave_the_attempt_unbilled(ledger, monkeypatch):
    ledger.lanes()
    real = settlement_module.settle

    def slow_settle(cur, *args, **kwargs):  # the settlement transaction is still open when the timeout fires
        time.sleep(TIMEOUT + 0.2)
        return real(cur, *args, **kwargs)

    monkeypatch.setattr(settlement_module, "settle", slow_settle)

    assert _run_in_worker_thread(0.1).name == "TimedOut"
    job, s = _only_job(ledger)
    assert (s["actual"], job["state"], job["actual"]) == (777, "done", 777)
    assert ledger.lane("free").leased == 0 and ledger.lane("free").reserved == 0
    assert ledger.audit() == []


@pytest.mark.timeout(120, method="thread")  # no SIGALRM handler of pytest's: Prefect uses its alarm
def test_a_call_interrupted_by_the_alarm_bills_the_estimate_marked(ledger):
    ledger.lanes()
    from prefect._internal.concurrency.cancellation import _get_thread_shield

    # A shield left held in this thread (by an earlier test) would swallow the alarm for good.
    assert not _get_thread_shield(threading.main_thread()).active(), "an earlier test leaked Prefect's shield"
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL, "Prefect uses its alarm only with none installed"

    states = []

    @flow
    def f():
        states.append(slow(TIMEOUT + 2.0, return_state=True))

    f()
    assert states[0].name == "TimedOut"
    job, s = _only_job(ledger)
    assert job["finished_at"] - job["admitted_at"] < TIMEOUT + 1.5, "the alarm interrupts the call"
    assert (s["actual"], bool(s["by_estimate"]), s["outcome"]) == (500, True, "failed")
    assert ledger.audit() == []


def test_a_cancelled_async_call_bills_the_estimate_marked(ledger):
    ledger.lanes()

    states = []

    @flow
    async def f():
        states.append(await slow_async(TIMEOUT + 2.0, return_state=True))

    asyncio.run(f())
    assert states[0].name == "TimedOut"
    job, s = _only_job(ledger)
    assert (s["actual"], bool(s["by_estimate"]), s["outcome"]) == (500, True, "failed")
    assert ledger.audit() == []
