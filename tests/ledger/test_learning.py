"""What learned estimators keep in the ledger: input tokens per job, by-estimate bills, fitted state.

Runs on SQLite and PostgreSQL (fixture ``ledger_url``).
"""

from __future__ import annotations

import pytest

from lane_plugin import InvalidInput, Ledger

from ..tables import job_rows, settlements


def _settle(
    led: Ledger,
    stage: str,
    est: int,
    actual: int,
    *,
    est_input: int | None,
    by_estimate: bool = False,
    lane: str = "free",
) -> str:
    jid = led.submit(stage, est, lane, est_input=est_input)
    assert jid in {x.job_id for x in led.tick(lane)}
    led.settle(jid, actual, by_estimate=by_estimate)
    return jid


def test_intake_records_the_input_tokens_and_settlement_the_by_estimate_mark(ledger_url):
    led = Ledger(ledger_url)
    a = _settle(led, "draft", 900, 1000, est_input=700)
    b = _settle(led, "draft", 900, 900, est_input=None, by_estimate=True)
    rows = {j["id"]: j for j in job_rows(led)}
    assert (rows[a]["est_input"], rows[b]["est_input"]) == (700, None)
    marks = {s["job_id"]: bool(s["by_estimate"]) for s in settlements(led)}
    assert marks == {a: False, b: True}
    assert led.settle(b, 900).by_estimate is True  # a replay says so too
    settled = {r["id"]: r for r in led.settled_jobs()}
    assert (settled[a]["by_estimate"], settled[b]["by_estimate"], settled[a]["est_input"]) == (False, True, 700)
    assert led.job(a)["est_input"] == 700
    assert led.audit() == []


def test_output_samples_are_the_newest_learnable_jobs_per_stage_oldest_first(ledger_url, clock):
    led = Ledger(ledger_url, clock=clock)
    for i in range(5):
        clock.t += 1
        _settle(led, "draft", 500, 400 + i, est_input=100)
    clock.t += 1
    _settle(led, "draft", 500, 500, est_input=100, by_estimate=True)  # a guess billed back: never learned
    clock.t += 1
    _settle(led, "draft", 500, 999, est_input=None)  # input unknown: nothing to learn
    clock.t += 1
    _settle(led, "review", 50, 70, est_input=20, lane="paid")
    failed = led.submit("draft", 500, est_input=100)
    led.tick("free")
    led.settle(failed, 123, outcome="failed")
    assert led.output_samples(window=3) == {"draft": [(100, 402), (100, 403), (100, 404)], "review": [(20, 70)]}
    assert led.output_samples(window=10, lane="paid") == {"review": [(20, 70)]}
    assert led.output_samples(window=10, stage="review") == {"review": [(20, 70)]}
    with pytest.raises(InvalidInput, match="window"):
        led.output_samples(window=0)


def _row(name: str, **over) -> dict:
    row = dict(
        stage=name,
        revision="abcd1234",
        allowance=250,
        jobs=40,
        mean=251.5,
        m2=1000.0,
        mean_input=800.0,
        p50=240.0,
        p90=400.0,
        p99=900.0,
    )
    row.update(over)
    return row


def test_estimator_state_is_written_whole_and_read_back(ledger_url, clock):
    led = Ledger(ledger_url, clock=clock)
    led.save_estimator_state("learned", [_row("draft"), _row("critique", allowance=-12, mean=-11.6)])
    clock.t += 10
    led.save_estimator_state("learned", [_row("draft", allowance=300, revision="ffff0000")])
    led.save_estimator_state("other", [_row("draft", allowance=1)])
    state = {r["stage"]: r for r in led.estimator_state("learned")}
    assert (state["draft"]["allowance"], state["draft"]["revision"], state["critique"]["allowance"]) == (
        300,
        "ffff0000",
        -12,
    )
    assert state["draft"]["fitted_at"] == clock.t and state["critique"]["fitted_at"] == clock.t - 10
    assert {(r["estimator"], r["stage"]) for r in led.estimator_state()} == {
        ("learned", "critique"),
        ("learned", "draft"),
        ("other", "draft"),
    }


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(allowance=1.5), "allowance"),
        (dict(jobs=-1), "jobs"),
        (dict(m2=-1.0), "m2"),
        (dict(mean=float("nan")), "mean"),
        (dict(stage=""), "stage"),
        (dict(revision="x" * 17), "revision"),
    ],
)
def test_bad_state_rows_write_nothing(ledger_url, bad, field):
    led = Ledger(ledger_url)
    with pytest.raises(InvalidInput, match=field):
        led.save_estimator_state("learned", [_row("draft"), _row("critique", **bad)])
    assert led.estimator_state() == []
