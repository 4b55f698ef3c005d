"""Issue 10 item 5: a task that times out while it waits for admission leaves no job for a later tick to
lease to nobody: its job is parked ``waiter gone`` at once (Prefect's retry would make the next attempt)."""

from __future__ import annotations

import pytest
from prefect import flow

from lane_plugin import lane_task

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(120)]


@lane_task(stage="waits", estimate=10, lane="full", timeout_seconds=1.5)
def waits() -> int:
    return 10


def test_a_task_timed_out_while_waiting_parks_its_job_and_no_tick_leases_it(ledger):
    ledger.set_lane("full", allowance=10_000, ceiling=10_000, start_fraction=1.0, max_leased=1)
    ledger.submit("holder", 10, "full")  # a CLI job holds the lane's only slot
    [held] = ledger.tick("full")
    states = []

    @flow
    def f():
        states.append(waits(return_state=True))

    f()
    assert states[0].name == "TimedOut"
    _, rows = ledger.rows("select id, state, reason from job where stage = 'waits'")
    [(job_id, state, reason)] = rows
    assert state == "parked" and reason.startswith("waiter gone"), (state, reason)
    ledger.settle(held, 10)  # room frees: neither the hand-off nor a tick leases the orphan
    assert ledger.tick("full") == []
    assert ledger.job(job_id)["state"] == "parked"
    assert ledger.audit() == []
