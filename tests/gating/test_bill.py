"""The flow run's token bill (``lane-bill``) and the task run's INFO token lines (issue 13, items 1-2)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from lane_plugin import lane_task

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(120)]


@lane_task(stage="draft", estimate=100)
def draft(n: int):
    return {"usage": {"total_tokens": 100 + 10 * n}}


@lane_task(stage="critique", estimate=200)
def critique(n: int):
    return None  # no usage: billed by its estimate


@lane_task(stage="draft", estimate=100)
async def adraft(n: int):
    await asyncio.sleep(0)
    return {"usage": {"total_tokens": 150}}


def bills(flow_run_id) -> list:
    """The lane-bill artifacts linked to one flow run, as the Prefect API has them."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["lane-bill"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
            )
        )


def by_stage(artifact) -> dict:
    rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    return {r["stage"]: r for r in rows}


def test_a_completed_run_carries_its_bill_linked_to_it_without_user_code(ledger):
    @flow(task_runner=ThreadPoolTaskRunner(max_workers=4))
    def pipeline():
        futures = [draft.submit(n) for n in range(3)] + [critique.submit(9)]
        return [f.result() for f in futures]

    state = pipeline(return_state=True)
    assert state.is_completed()
    run_id = state.state_details.flow_run_id
    [art] = bills(run_id)
    assert art.type == "table" and art.flow_run_id == run_id and art.task_run_id is None
    rows = by_stage(art)
    d, c = rows["draft"], rows["critique"]
    assert (d["lane"], d["jobs"], d["estimated"], d["actual"], d["overage"]) == ("free", 3, 300, 330, 30)
    assert d["drift"] == 1.1 and d["billed_by_estimate"] == 0 and d["unsettled"] == 0
    assert d["tenant"] == c["tenant"] == rows["(all)"]["tenant"] == "pipeline"  # the flow's name (no deployment)
    assert (c["jobs"], c["estimated"], c["actual"], c["billed_by_estimate"]) == (1, 200, 200, 1)
    assert d["wait_p50_s"] is not None and d["wait_max_s"] >= d["wait_p50_s"] >= 0
    total = rows["(all)"]
    assert (total["jobs"], total["estimated"], total["actual"]) == (4, 500, 530)
    assert "4 gated job(s) of this flow run (Completed)" in art.description
    assert "1 attempt(s) billed by estimate" in art.description and str(ledger.url) in art.description
    # the same numbers straight from the ledger: the typed read the artifact is made of
    lines = {b.stage: b for b in ledger.run_bill(str(run_id))}
    assert lines["draft"].actual == 330 and lines["critique"].by_estimate == 1


def test_a_failed_run_is_billed_too(ledger):
    @flow
    def pipeline():
        draft(1)
        raise RuntimeError("the model went away")

    state = pipeline(return_state=True)
    assert state.is_failed()
    [art] = bills(state.state_details.flow_run_id)
    assert by_stage(art)["draft"]["actual"] == 110
    assert "(Failed)" in art.description


def test_a_run_whose_gated_task_was_parked_is_billed_with_the_job_unsettled(ledger):
    ledger.set_lane("free", stopped=True)

    @lane_task(stage="late", estimate=50, deadline=0.2)
    def late():
        return 50

    @flow
    def pipeline():
        draft.with_options(name="draft-first")  # unchanged: nothing runs here
        late()

    state = pipeline(return_state=True)
    ledger.set_lane("free", stopped=False)
    assert state.is_failed()
    [art] = bills(state.state_details.flow_run_id)
    row = by_stage(art)["late"]
    assert (row["jobs"], row["unsettled"], row["actual"], row["wait_p50_s"]) == (1, 1, 0, None)
    assert "1 job(s) never billed" in art.description


def test_async_flows_and_subflows_get_their_own_bills(ledger):
    @flow
    async def child():
        return await adraft(1)

    @flow
    async def parent():
        await adraft(2)
        return await child(return_state=True)

    state = asyncio.run(parent(return_state=True))
    child_state = state.result()
    parent_id, child_id = state.state_details.flow_run_id, child_state.state_details.flow_run_id
    assert parent_id != child_id
    assert by_stage(bills(parent_id)[0])["draft"]["jobs"] == 1
    assert by_stage(bills(child_id)[0])["draft"]["actual"] == 150


def test_a_flow_without_gated_tasks_gets_no_bill(ledger):
    @flow
    def plain():
        return 1

    state = plain(return_state=True)
    assert bills(state.state_details.flow_run_id) == []


def test_the_task_run_log_tells_its_tokens_at_info(ledger, caplog):
    caplog.set_level(logging.INFO, logger="prefect.task_runs")
    caplog.set_level(logging.INFO, logger="prefect.flow_runs")

    @flow
    def one():
        draft(5)
        critique(1)

    one()
    lines = [r.getMessage() for r in caplog.records if r.name == "prefect.task_runs" and r.levelno == logging.INFO]
    admitted = [m for m in lines if "admitted" in m]
    settled = [m for m in lines if "settled" in m]
    assert admitted[0].startswith("lane gate: draft admitted in lane 'free' after waiting ")
    assert "estimate 100 tokens; " in admitted[0] and "of 8,000,000 remaining" in admitted[0]
    _, jobs = ledger.rows("select stage, id from job")
    ids = dict(jobs)
    assert admitted[0].endswith(f"; job {ids['draft']}")  # what `lane status JOB` takes
    assert (
        settled[0] == f"lane gate: draft settled 150 tokens (estimate 100, drift 1.50, overage 50); job {ids['draft']}"
    )
    assert settled[1] == (
        "lane gate: critique settled 200 tokens (estimate 200, drift 1.00, overage 0); "
        f"billed by estimate: no usage was found; job {ids['critique']}"
    )
    flow_lines = [r.getMessage() for r in caplog.records if r.name == "prefect.flow_runs"]
    assert any(f"use the ledger at {ledger.url}" in m for m in flow_lines)
