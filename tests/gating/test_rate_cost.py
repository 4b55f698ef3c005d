"""``rate_cost`` through the gate: what the provider's rate limiter counts, beside the estimate."""

from __future__ import annotations

import inspect

import pytest
from prefect import flow

from lane_plugin import InvalidInput, gate, lane_task

from ..tables import job_rows, settlements

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(120)]


def test_lane_task_takes_rate_cost_as_an_int_or_a_callable_of_its_arguments(ledger):
    ledger.set_lane("rl", allowance=10**6, ceiling=10**6, burst_tokens=5_000, window_seconds=60.0)
    assert "rate_cost" in inspect.signature(lane_task).parameters  # what benchmarks/bench_provider.py looks for

    @lane_task(
        stage="chat",
        estimate=lambda prompt, max_tokens: len(prompt) // 4 + max_tokens // 2,
        lane="rl",
        rate_cost=lambda prompt, max_tokens: len(prompt) // 4 + max_tokens,
    )
    def chat(prompt: str, max_tokens: int):
        return {"usage": {"total_tokens": len(prompt) // 4 + 100}}

    @lane_task(stage="fixed", estimate=50, lane="rl", rate_cost=900)
    def fixed():
        return 40

    @flow
    def f():
        return chat("x" * 400, 1_000), fixed()

    f()
    rows = {r["stage"]: r for r in job_rows(ledger)}
    assert (rows["chat"]["est"], rows["chat"]["rate_cost"], rows["chat"]["actual"]) == (600, 1_100, 200)
    assert (rows["fixed"]["est"], rows["fixed"]["rate_cost"]) == (50, 900)
    assert {s["lane"]: s for s in ledger.lanes()}["rl"]["window_used"] == 2_000
    assert ledger.audit() == []


def test_a_bad_rate_cost_is_refused_before_anything_is_written(ledger):
    with pytest.raises(InvalidInput, match="rate_cost"):
        lane_task(stage="s", estimate=10, rate_cost="lots")
    with pytest.raises(InvalidInput, match="rate_cost"):
        lane_task(stage="s", estimate=10, rate_cost=0)
    with pytest.raises(InvalidInput, match="rate_cost"):
        gate(stage="s", estimate=10, rate_cost=lambda: 5)

    @lane_task(stage="neg", estimate=10, rate_cost=lambda n: -n)
    def neg(n: int):
        return 1

    @flow
    def f():
        return neg(3)

    with pytest.raises(InvalidInput, match="rate_cost for stage 'neg'"):
        f()
    assert job_rows(ledger) == []


def test_gate_takes_an_int_rate_cost(ledger):
    ledger.set_lane("rl", allowance=10**6, ceiling=10**6, burst_tokens=5_000, window_seconds=60.0)
    with gate(stage="block", estimate=300, lane="rl", rate_cost=1_300) as g:
        g.report(250)
    [row] = job_rows(ledger)
    assert (row["est"], row["rate_cost"], row["actual"]) == (300, 1_300, 250)


def test_rate_cost_splits_input_and_output_for_a_lanes_limits(ledger):
    ledger.set_lane(
        "io",
        allowance=10**6,
        ceiling=10**6,
        burst_tokens=5_000,
        window_seconds=60.0,
        limits=["input_tokens=4000/60s", "output_tokens=1000/60s"],
    )

    @lane_task(
        stage="chat",
        estimate=lambda prompt, max_tokens: len(prompt) // 4 + max_tokens,
        lane="io",
        rate_cost=lambda prompt, max_tokens: {"input": len(prompt) // 4, "output": max_tokens},
    )
    def chat(prompt: str, max_tokens: int):
        return {"usage": {"input_tokens": len(prompt) // 4, "output_tokens": 40}}

    @flow
    def f():
        return chat("x" * 400, 500)

    f()
    (row,) = job_rows(ledger)
    assert (row["rate_cost"], row["rate_input"], row["rate_output"]) == (600, 100, 500)
    use = {u["unit"]: u["used"] for u in {s["lane"]: s for s in ledger.lanes()}["io"]["limit_use"]}
    assert use == {"tokens": 600, "input_tokens": 100, "output_tokens": 40}  # output trued up to what it generated
    with pytest.raises(InvalidInput, match="rate_cost"):
        lane_task(stage="s", estimate=10, rate_cost={"input": 5})
    assert ledger.audit() == []


def _output_lane(ledger, name: str) -> None:
    """A lane whose only binding limit is output_tokens 1000/60s."""
    ledger.set_lane(
        name,
        allowance=10**6,
        ceiling=10**6,
        burst_tokens=10**5,
        window_seconds=60.0,
        limits=["output_tokens=1000/60s"],
    )


def _output_used(ledger, name: str) -> int:
    """What the lane's output_tokens window holds, as lane status reads it."""
    use = {u["unit"]: u["used"] for u in {s["lane"]: s for s in ledger.lanes()}[name]["limit_use"]}
    return use["output_tokens"]


def test_a_cached_prompt_still_counts_its_output_against_the_output_limit(ledger):
    # Anthropic bills cache reads at a tenth of an input token: 100 input + 5,000 read + 40 output bill 640,
    # less than the 5,100-token prompt the job stated as its input. The output window counts the 40 the
    # response says were generated, not 640 - 5,100 (nothing).
    _output_lane(ledger, "cache")

    @lane_task(stage="chat", estimate=5_400, lane="cache", rate_cost={"input": 5_100, "output": 300})
    def chat():
        return {"usage": {"input_tokens": 100, "cache_read_input_tokens": 5_000, "output_tokens": 40}}

    @flow
    def f():
        return chat()

    f()
    (row,) = job_rows(ledger)
    assert row["actual"] == 640
    assert _output_used(ledger, "cache") == 40
    assert ledger.audit() == []


def test_an_attempt_billed_by_its_estimate_counts_its_allowance_as_output(ledger):
    # No usage came back: the gate bills the estimate and cannot say what was generated. The output window
    # keeps the allowance (estimate less input), not the nothing the empty meter would state.
    _output_lane(ledger, "blind")

    @lane_task(stage="chat", estimate=500, lane="blind", rate_cost={"input": 200, "output": 300})
    def chat():
        return "a reply without usage"

    @flow
    def f():
        return chat()

    f()
    (row,) = settlements(ledger)
    assert row["actual"] == 500 and row["by_estimate"]
    assert _output_used(ledger, "blind") == 300
    assert ledger.audit() == []
