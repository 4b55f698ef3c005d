"""flows/pipeline.py: the example pipeline runs gated, settles every stage and its drift report finds the critique."""

from __future__ import annotations

import pytest

from ..tables import job_rows

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(120)]


def test_pipeline_gates_every_stage_and_drift_finds_the_underestimated_stage(ledger):
    from flows.pipeline import LocalModel, pipeline, report

    totals = pipeline(docs=6, seed=3, db=ledger.url.raw)
    jobs = job_rows(ledger)
    assert len(jobs) == 18 and {j["state"] for j in jobs} == {"done"}
    assert {j["est_version"] for j in jobs} == {"chars4-v1"}
    assert sum(totals.values()) == ledger.lane("free").spent
    assert len({j["run_key"] for j in jobs}) == 1
    text = report(ledger, since=None)
    assert "Lane status" in text and "Drift report" in text
    rows = {line.split()[0]: line for line in text.splitlines()[-3:]}
    assert "overspends" in rows["critique"] and "honest" in rows["draft"]
    assert LocalModel(seed=3).complete("x", stage="draft") == LocalModel(seed=3).complete("x", stage="draft")
    assert ledger.audit() == []
