"""Issue 10 item 10 (last): a task whose body returned, then hit Prefect's ``timeout_seconds``, billed
only its ``report_usage`` tokens: the return value's usage was lost. (Fixed on main by a935922,
``gating/timeouts.py``: the settlement is shielded and the deferred timeout raised after it; this
pins it with both kinds of usage in one attempt.)"""

from __future__ import annotations

import time

import pytest
from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from lane_plugin import lane_task, report_usage

from .conftest import figure

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(180)]


# Prefect's timeout covers admission too: on a loaded CI machine admission once took over a second,
# and a 1-second timeout fired before the body ran. The body outlasts this by a second.
TIMEOUT = 3.0


@lane_task(stage="late", estimate=500, timeout_seconds=TIMEOUT)
def late(delay: float):
    report_usage(100)  # a first call, reported as it came back
    time.sleep(delay)  # the second call: it returns after the timeout, with its usage
    return {"usage": {"total_tokens": 777}}


def test_a_timeout_after_the_body_returned_bills_reported_and_returned_usage(ledger):
    ledger.lanes()  # migrate first: the timeout must not land in the ledger's creation
    states = []

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=2))
    def f():
        fut = late.submit(TIMEOUT + 1.0)
        fut.wait()
        states.append(fut.state)

    f()
    cols, rows = ledger.rows("select actual, by_estimate, late from settlement")
    [(actual, by_estimate, was_late)] = rows
    figure(
        f"timeout after return: task run {states[0].name}, billed {actual} of 100 reported + 777 returned "
        f"(by_estimate {bool(by_estimate)})"
    )
    assert states[0].name == "TimedOut"
    assert (actual, bool(by_estimate), bool(was_late)) == (877, False, False)
    assert ledger.lane("free").spent == 877 and ledger.lane("free").reserved == 0
    assert ledger.audit() == []
