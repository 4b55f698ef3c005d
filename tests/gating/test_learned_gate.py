"""A gated task estimated by ``learned``: its input tokens are recorded at intake, so it can be learned from."""

from __future__ import annotations

import pytest
from prefect import flow

from lane_plugin import lane_task
from lane_plugin.estimators import TokenCounter, learned

from ..tables import job_rows

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(120)]


def test_a_learned_estimate_records_its_input_tokens_and_version(ledger):
    est = learned("gpt-4o", ledger=ledger, prior={"draft": 300, "critique": 200})
    messages = [{"role": "user", "content": "Summarise: the ledger admits jobs by tokens, not by count."}]
    n = TokenCounter("gpt-4o").count_messages(messages)

    @lane_task(stage="draft", estimate=est)
    def draft(msgs):
        return {"usage": {"prompt_tokens": n, "completion_tokens": 280}}

    @lane_task(stage="critique", estimate=lambda text: est.breakdown(text, stage="critique"))
    def critique(text: str):
        return {"usage": {"total_tokens": 500}}

    @flow
    def f():
        draft(messages)
        critique("Critique this summary, please.")

    f()
    jobs = {j["stage"]: j for j in job_rows(ledger)}
    assert (jobs["draft"]["est"], jobs["draft"]["est_input"], jobs["draft"]["est_version"]) == (
        n + 300,
        n,
        "learned(o200k_base)#00000000",
    )
    crit_input = TokenCounter("gpt-4o").count("Critique this summary, please.")
    assert (jobs["critique"]["est"], jobs["critique"]["est_input"]) == (crit_input + 200, crit_input)
    assert jobs["critique"]["est_version"] == "learned(o200k_base)#00000000"
    assert ledger.output_samples()["draft"] == [(n, n + 280)]


def test_a_learned_estimate_brings_its_stage_spread_to_admission(ledger):
    """Issue 12 item 3: the stage's fitted spread rides with the job (est_var) and into the lane's reserved_var."""
    from lane_plugin.estimators import OutputLearner

    fitted = OutputLearner(min_jobs=3)
    for out in (100, 300, 200):
        fitted.observe("draft", 1_000, 1_000 + out)
    ledger.save_estimator_state("learned", fitted.rows())  # what a refit stores: allowance 200, variance 10,000
    est = learned("gpt-4o", ledger=ledger, refresh=0.0)
    seen = {}

    @lane_task(stage="draft", estimate=lambda text: est.breakdown(text, stage="draft"))
    def draft(text: str):
        seen["lane"] = next(s for s in ledger.lanes() if s["lane"] == "free")
        return {"usage": {"total_tokens": 250}}

    @flow
    def f():
        draft("Summarise the ledger.")

    f()
    [job] = job_rows(ledger)
    n = TokenCounter("gpt-4o").count("Summarise the ledger.")
    assert (job["est"], job["est_input"], job["est_var"]) == (n + 200, n, 10_000)
    assert (seen["lane"]["reserved_var"], seen["lane"]["headroom"]) == (10_000, 200)  # while it ran
    assert next(s for s in ledger.lanes() if s["lane"] == "free")["reserved_var"] == 0  # settled
