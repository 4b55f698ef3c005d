"""A misspelt lane is caught at a task's first call, once, with "did you mean" (issue 26).

It used to fail at run time, once per task run, with a traceback each.
"""

from __future__ import annotations

import pytest
from prefect import flow, task

from lane_plugin import UnknownLane, gate, lane_task

from ..tables import job_rows

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(120)]


@lane_task(stage="draft", estimate=10, lane="mylan")
def misspelt(n: int):
    return n


@lane_task(stage="draft", estimate=10, lane="mylane", fallback="piad")
def misspelt_fallback(n: int):
    return n


@lane_task(stage="draft", estimate=10, lane="mylane")
def spelt(n: int):
    return n


def test_a_misspelt_lane_fails_the_first_call_once_and_no_task_run_starts(ledger):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    ledger.set_lane("mylane", create=True, allowance=100_000)
    ran: list[int] = []

    @flow
    def pipeline():
        ran.append(1)
        return [misspelt.submit(i) for i in range(5)]

    state = pipeline(return_state=True)
    with pytest.raises(UnknownLane) as err:
        state.result()
    msg = str(err.value)
    assert msg.startswith("unknown lane 'mylan' (did you mean 'mylane'? @lane_task 'misspelt' (stage 'draft') names it")
    assert err.value.suggestion == "mylane" and ran == [1] and job_rows(ledger) == []
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        )
    assert runs == []  # caught in the flow, before any task run: no traceback per task

    @flow
    def with_fallback():
        return misspelt_fallback(1)

    with pytest.raises(UnknownLane, match=r"unknown lane 'piad' \(did you mean 'paid'\? .* names it as its fallback"):
        with_fallback()

    @flow
    def fine():
        return [spelt.submit(i) for i in range(3)]

    assert [f.result() for f in fine()] == [0, 1, 2]  # the lane known, the check passes (and is not read again)
    assert {j["lane"] for j in job_rows(ledger)} == {"mylane"} and ledger.audit() == []


def test_gate_with_a_misspelt_lane_says_did_you_mean_at_its_first_call(ledger):
    ledger.set_lane("mylane", create=True, allowance=100_000)

    @task
    def body():
        with gate(stage="critique", estimate=10, lane="mylan") as g:
            g.report(10)

    @flow
    def f():
        return body()

    with pytest.raises(UnknownLane, match=r"unknown lane 'mylan' \(did you mean 'mylane'\? lane lanes lists them\)"):
        f()
    assert job_rows(ledger) == []
