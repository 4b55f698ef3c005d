"""Issue 10 item 11 (found under Dask): the same task attempt run a second time.

Dask runs a task again on another worker when the worker running it dies, and Prefect's engine
starts that task run again with the same id and ``run_count``: the gate submits the same key and
attempt a second time. Before the fix the second run either waited for ever behind its own settled
job (settled, then the worker died before Dask had the result: the job is ``done``, the gate polls
a job no tick will ever lease) or took over the first run's lease, so that both runs settled the
same (job, attempt) and the second settlement was dropped as a replay (tokens the provider billed,
lost: I5). Now a second run of an attempt that was leased, settled or failed is the job's next
attempt, and every run is billed once.
"""

from __future__ import annotations

import time

import pytest

from lane_plugin import Ledger
from lane_plugin.gating.context import Gate

from .conftest import assert_audit_clean, figure, make_lane


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request):
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def _settlements(led: Ledger, key: str) -> list[tuple]:
    return led.rows(
        "select s.attempt, s.actual, s.late from settlement s join job j on j.id = s.job_id "
        "where j.key = :k order by s.attempt",
        {"k": key},
    )[1]


def test_a_settled_attempt_run_again_is_the_next_attempt_not_a_wait_for_ever(url):
    led = Ledger(url)
    make_lane(led, lease_seconds=30.0)
    with Gate("draft", 100, ledger=url, key="task-run-1", attempt=1) as first:
        first.report(90)
    # the worker died after the settlement committed, before Dask had the result: the same run again
    t0 = time.monotonic()
    with Gate("draft", 100, ledger=url, key="task-run-1", attempt=1, deadline=5) as again:
        again.report(80)
    waited = time.monotonic() - t0
    assert waited < 3.0, f"the second run waited {waited:.1f}s for a job nobody will lease"
    assert (first.settled.attempt, again.settled.attempt) == (1, 2)
    assert not again.settled.replay and not again.settled.late
    assert _settlements(led, "task-run-1") == [(1, 90, False), (2, 80, False)]
    row = led.lane("free")
    assert (row.spent, row.reserved, row.leased) == (170, 0, 0)
    assert_audit_clean(led)
    led.close()


def test_two_runs_of_one_attempt_never_share_a_lease(url):
    led = Ledger(url)
    make_lane(led, lease_seconds=30.0)
    first = Gate("draft", 100, ledger=url, key="task-run-2", attempt=1)
    first.__enter__()  # holds the lease; Dask then declares its worker dead and runs the task elsewhere
    again = Gate("draft", 100, ledger=url, key="task-run-2", attempt=1)
    again.__enter__()
    assert first.lease.attempt == 1 and again.lease.attempt == 2
    assert first.lease.token != again.lease.token, "two runs hold one lease: one of their settlements is lost"
    again.report(70)
    again.__exit__(None, None, None)
    first.report(60)  # the first run was alive after all: its tokens were billed by the provider
    first.__exit__(None, None, None)
    assert not first.settled.replay, "the first run's 60 tokens were dropped as a replay"
    assert first.settled.late and first.settled.attempt == 1
    assert _settlements(led, "task-run-2") == [(1, 60, True), (2, 70, False)]
    row = led.lane("free")
    assert (row.spent, row.reserved, row.leased) == (130, 0, 0)
    assert_audit_clean(led)
    figure(
        f"rerun {url.split(':')[0].split('+')[0]}: two runs of one attempt hold leases of attempts 1 and 2 and "
        f"settle 60 (late) + 70 = spent {row.spent}; nothing dropped as a replay"
    )
    led.close()


def test_a_waiting_attempt_run_again_is_the_same_job(url):
    """A run that died while waiting never held a lease: the next run waits as the same job."""
    led = Ledger(url)
    make_lane(led, ceiling=100, max_leased=1)
    blocker = led.submit("other", 100)
    led.tick("free")
    jid = led.submit("draft", 50, key="task-run-3", attempt=1, rerun=True)
    assert led.submit("draft", 50, key="task-run-3", attempt=1, rerun=True) == jid
    job = led.job(jid)
    assert (job["state"], job["attempt"]) == ("new", 1)
    led.settle(blocker, 100)
    assert led.job(jid)["state"] == "new"
    # without rerun (the CLI, a caller's own key), a settled job's key is a replay, as before
    led.set_lane("free", ceiling=1000, allowance=1000)
    led.tick("free")
    led.settle(jid, 40)
    assert led.submit("draft", 50, key="task-run-3", attempt=1) == jid and led.job(jid)["state"] == "done"
    assert_audit_clean(led)
    led.close()


def test_a_rerun_with_a_persisted_result_is_a_cache_hit(ledger, prefect_server):
    """What docs/many-machines.md advises against paying twice for a result Dask lost: persist results.

    Dask's rerun is ``run_task_sync`` with the same task run id and parameters (prefect_dask's client);
    with ``persist_result=True`` Prefect's default cache policy finds the first run's result, so the
    rerun runs no body, waits for nothing and bills nothing.
    """
    import uuid

    from prefect import flow
    from prefect.context import serialize_context
    from prefect.task_engine import run_task_sync

    from lane_plugin import lane_task, report_usage

    make_lane(ledger)
    bodies = []

    @lane_task(stage="draft", estimate=100, persist_result=True)
    def work(i: int) -> str:
        bodies.append(i)
        report_usage(50)
        return f"r{i}"

    @flow
    def twice():
        run_id, ctx = uuid.uuid4(), serialize_context()
        return [
            run_task_sync(work, task_run_id=run_id, parameters={"i": 1}, return_type="state", context=ctx)
            for _ in range(2)
        ]

    first, again = twice()
    assert (first.is_completed(), again.name, bodies) == (True, "Cached", [1])
    assert ledger.rows("select attempt, state, actual from job")[1] == [(1, "done", 50)]
    assert ledger.lane("free").spent == 50
    assert_audit_clean(ledger)
