"""The gate inside real Prefect flows: sync, async, submit, map, retries, failures and caching."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from prefect import flow, task
from prefect.cache_policies import INPUTS
from prefect.context import TaskRunContext
from prefect.task_runners import ThreadPoolTaskRunner

from lane_plugin import LaneError, lane_task, report_usage
from lane_plugin.errors import UsageMissing

from ..tables import job_rows, settlements

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(120)]


@lane_task(stage="draft", estimate=lambda doc: 400 + len(doc) // 3, retries=1, tags=["team:docs"])
def draft(doc: str):
    ctx = TaskRunContext.get()
    return {"usage": {"prompt_tokens": 300 + len(doc), "completion_tokens": 100}, "run": str(ctx.task_run.id)}


@lane_task(stage="critique", estimate=500)
async def critique(text: str):
    await asyncio.sleep(0)
    report_usage(40)  # adds to the usage read from the return value
    return {"usage": {"total_tokens": 260}}


def test_sync_task_settles_usage_keyed_by_task_run(ledger):
    @flow
    def one(doc: str):
        return draft(doc, return_state=True)

    state = one("x" * 60, return_state=True)
    task_state = state.result()
    out = task_state.result()
    [job] = job_rows(ledger)
    assert (job["stage"], job["lane"], job["est"], job["actual"], job["state"]) == ("draft", "free", 420, 460, "done")
    assert job["key"] == f"prefect-task-run:{out['run']}" and job["attempt"] == 1
    assert job["run_key"] == str(state.state_details.flow_run_id)
    assert ledger.lane("free").reserved == 0 and ledger.lane("free").spent == 460
    assert ledger.audit() == []


def test_task_is_a_real_prefect_task_with_lane_tags_and_options():
    from prefect import Task

    assert isinstance(draft, Task)
    assert set(draft.tags) == {"lane:free", "stage:draft", "team:docs"}
    assert draft.retries == 1 and draft.name == "draft"
    assert draft.fn.__name__ == "draft" and not hasattr(draft.fn, "__wrapped__")  # the user's function


def test_with_options_keeps_the_lane_tags():
    copy = draft.with_options(tags=["team:search"], retries=0)
    assert set(copy.tags) == {"lane:free", "stage:draft", "team:search"} and copy.retries == 0
    again = copy.with_options(tags=[])
    assert set(again.tags) == {"lane:free", "stage:draft"}
    assert set(draft.with_options(name="other").tags) == {"lane:free", "stage:draft", "team:docs"}


def test_task_run_name_and_tags_show_in_prefect(ledger):
    from prefect.client.orchestration import get_client

    @flow
    def one():
        return draft("abc", return_state=True)

    task_state = one()
    with get_client(sync_client=True) as client:
        tr = client.read_task_run(task_state.state_details.task_run_id)
    assert tr.name.startswith("draft-")
    assert {"lane:free", "stage:draft"} <= set(tr.tags)
    assert ledger.audit() == []


def test_async_task_in_async_flow(ledger):
    @flow
    async def both(texts):
        return await asyncio.gather(*(critique(t) for t in texts))

    assert len(asyncio.run(both(["a", "b", "c"]))) == 3
    jobs = job_rows(ledger)
    assert [j["actual"] for j in jobs] == [300, 300, 300]
    assert {j["state"] for j in jobs} == {"done"}
    assert ledger.audit() == []


def test_submit_and_map_on_a_thread_pool(ledger):
    docs = [f"doc {i} " * i for i in range(8)]

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=4))
    def fan_out():
        futures = [draft.submit(d) for d in docs[:4]]
        mapped = draft.map(docs[4:])
        return [f.result() for f in futures] + mapped.result()

    assert len(fan_out()) == 8
    jobs = job_rows(ledger)
    assert len(jobs) == 8 and {j["state"] for j in jobs} == {"done"}
    assert len({j["key"] for j in jobs}) == 8 and len({j["run_key"] for j in jobs}) == 1
    assert ledger.lane("free").spent == sum(400 + len(d) for d in docs)
    assert ledger.audit() == []


calls = {"flaky": 0}


@lane_task(stage="flaky", estimate=300, retries=2, retry_delay_seconds=0)
def flaky():
    calls["flaky"] += 1
    report_usage(50)  # spent before the failure: billed to that attempt
    if calls["flaky"] < 3:
        raise RuntimeError("provider hiccup")
    return 120


def test_retries_are_attempts_of_one_job_each_settled_once(ledger):
    calls["flaky"] = 0

    @flow
    def f():
        return flaky()

    assert f() == 120
    [job] = job_rows(ledger)
    assert job["attempt"] == 3 and job["state"] == "done"
    rows = [(s["attempt"], s["actual"], s["outcome"]) for s in settlements(ledger)]
    assert rows == [(1, 50, "failed"), (2, 50, "failed"), (3, 170, "done")]
    assert job["actual"] == 270 == ledger.lane("free").spent
    assert ledger.audit() == []


@lane_task(stage="boom", estimate=900)
def boom():
    report_usage(30)
    raise ValueError("bad document")


def test_exception_settles_reported_tokens_and_releases_the_rest(ledger):
    @flow
    def f():
        return boom()

    state = f(return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError, match="bad document"):
        state.result()
    [job] = job_rows(ledger)
    assert job["state"] == "failed" and job["actual"] == 30
    lane = ledger.lane("free")
    assert (lane.spent, lane.reserved, lane.leased) == (30, 0, 0)
    assert ledger.audit() == []


cached_runs = {"n": 0}
hook_states: list[str] = []


@lane_task(
    stage="cached",
    estimate=200,
    cache_policy=INPUTS,
    persist_result=True,
    on_completion=[lambda task, run, state: hook_states.append(state.name)],
)
def cached(x: int):
    cached_runs["n"] += 1
    return 111


def test_cache_hits_neither_wait_nor_settle(ledger):
    cached_runs["n"] = 0
    hook_states.clear()
    ledger.set_lane("free", stopped=True)  # a second admission would block for ever

    @flow
    def f(x):
        return cached(x)

    ledger.set_lane("free", stopped=False)
    x = uuid.uuid4().int % 10**9  # results persist across sessions: a fresh cache key per run
    assert f(x) == 111
    ledger.set_lane("free", stopped=True)
    assert f(x) == 111  # a cache hit: no body, so no wait for the stopped lane
    ledger.set_lane("free", stopped=False)
    assert cached_runs["n"] == 1 and hook_states == ["Completed", "Cached"]
    assert len(job_rows(ledger)) == 1 and len(settlements(ledger)) == 1
    assert ledger.audit() == []


@lane_task(stage="silent", estimate=321)
def silent():
    return "no usage here"


@lane_task(stage="strict", estimate=222, missing_usage="fail", retries=3)
def strict():
    return "no usage here"


def test_missing_usage_bills_the_estimate_and_says_so(ledger, caplog):
    caplog.set_level(logging.WARNING, logger="prefect.task_runs")

    @flow
    def f():
        return silent()

    assert f() == "no usage here"
    assert [j["actual"] for j in job_rows(ledger)] == [321]
    assert "found no token usage" in caplog.text and "billing its estimate of 321" in caplog.text


def test_missing_usage_can_fail_the_task_without_retrying(ledger):
    @flow
    def f():
        return strict()

    state = f(return_state=True)
    with pytest.raises(UsageMissing, match="returned no token usage"):
        state.result()
    [job] = job_rows(ledger)
    assert job["attempt"] == 1 and job["actual"] == 222 and job["state"] == "failed"
    assert ledger.audit() == []


def test_report_usage_outside_a_gate_is_an_error():
    with pytest.raises(LaneError, match="outside a gated block"):
        report_usage(5)


def test_a_gate_failing_between_its_admission_and_its_block_leaves_no_current_gate(ledger, monkeypatch):
    from lane_plugin import gate
    from lane_plugin.gating.context import Gate

    held = []

    def pause_read_fails(self, led):  # read once the gate holds its lease, before its block begins
        held.append(self.lease)
        raise RuntimeError("the pause could not be read")

    monkeypatch.setattr(Gate, "_paused_for", pause_read_fails)
    with pytest.raises(RuntimeError, match="could not be read"):
        with gate(stage="s", estimate=10):
            pass
    assert held and held[0] is not None  # the fault happened after the admission
    assert ledger.job(held[0].job_id)["state"] != "leased"  # and the lease was given back
    with pytest.raises(LaneError, match="outside a gated block"):  # main: the gone gate took these tokens
        report_usage(5)


def test_plain_task_with_the_gate_context_manager(ledger):
    from lane_plugin import gate

    from .test_usage import anthropic_message

    @task
    def legacy(n: int):
        with gate(stage="critique", estimate=1800) as g:
            g.report(anthropic_message(700, 300))
        with gate(stage="critique", estimate=1800) as g2:
            g2.report(5)
            g2.report(anthropic_message(1, 1))
        return g.job_id, g2.job_id

    @flow
    def f():
        return legacy(1)

    a, b = f()
    jobs = {j["id"]: j for j in job_rows(ledger)}
    assert jobs[a]["actual"] == 1000 and jobs[b]["actual"] == 7
    assert jobs[a]["key"].endswith(":critique:1") and jobs[b]["key"].endswith(":critique:2")
    assert ledger.audit() == []
