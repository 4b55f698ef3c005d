"""``learned``: exact input tokens plus a per-stage output allowance learned from settled jobs.

The learner is pure (a simulator feeds it at each settlement); the estimator's
state lives in the ledger, shared by every process, refitted there.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lane_plugin import InvalidInput, Ledger
from lane_plugin.estimators import (
    Constant,
    OutputLearner,
    TextLength,
    TokenCounter,
    calibrated,
    learned,
    refit,
    submit_kwargs,
)


def test_the_allowance_is_the_mean_output_once_min_jobs_settled():
    ol = OutputLearner(min_jobs=3)
    assert [ol.observe("draft", 1000, a) for a in (1100, 1300)] == [False, False]
    assert ol.allowance("draft") is None and ol.revision == "00000000"
    assert ol.observe("draft", 1000, 1200) is True
    assert ol.allowance("draft") == 200
    fit = ol.fit("draft")
    assert (fit.jobs, fit.mean, fit.mean_input, fit.p50) == (3, 200.0, 1000.0, 200.0)
    assert fit.variance == pytest.approx(statistics.variance([100, 300, 200]))


def test_the_allowance_moves_only_past_the_tolerance_and_the_revision_with_it():
    ol = OutputLearner(min_jobs=1, window=10, tolerance=0.05)
    ol.observe("s", 900, 1000)  # residual 100: published
    rev = ol.revision
    for _ in range(9):
        ol.observe("s", 900, 1010)  # mean 109: moved 9 < 5% of (900 + 100)
    assert (ol.allowance("s"), ol.revision) == (100, rev)
    for _ in range(10):
        ol.observe("s", 900, 1100)  # the window now holds only residuals of 200
    moved = ol.allowance("s")
    assert moved != 100 and ol.revision != rev
    assert abs(moved - 200) <= 0.05 * (900 + moved)  # it lags the mean by at most the tolerance


def test_residuals_can_be_negative_when_the_provider_counts_less_than_we_do():
    ol = OutputLearner(min_jobs=2)
    ol.observe("cached", 1000, 150)
    ol.observe("cached", 1000, 250)
    assert ol.allowance("cached") == -800
    est = learned(encoding="o200k_base", ledger=False, min_jobs=2)
    est.learner = ol
    assert est.estimate(1000, stage="cached") == 200
    assert est.estimate(5, stage="cached") == 1  # never below one token


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 9000)), min_size=1, max_size=80), st.integers(1, 30))
def test_running_sums_match_a_recomputation_over_the_window(pairs, window):
    ol = OutputLearner(window=window, min_jobs=1)
    for inp, act in pairs:
        ol.observe("s", inp, act)
    kept = [a - i for i, a in pairs][-window:]
    fit = ol.fit("s")
    assert fit.jobs == len(kept)
    assert fit.mean == pytest.approx(statistics.fmean(kept))
    expected_m2 = sum((r - statistics.fmean(kept)) ** 2 for r in kept)
    assert fit.m2 == pytest.approx(expected_m2, rel=1e-9, abs=1e-6)
    assert fit.p50 == pytest.approx(
        statistics.quantiles(kept, n=2, method="inclusive")[0] if len(kept) > 1 else kept[0]
    )


def test_the_estimate_counts_the_prompt_and_adds_the_stage_allowance():
    est = learned("gpt-4o", ledger=False, min_jobs=1, prior={"draft": 300})
    counter = TokenCounter("gpt-4o")
    messages = [{"role": "user", "content": "Summarise the attached report in three bullet points."}]
    n = counter.count_messages(messages)
    b = est.breakdown(messages, stage="draft")
    assert (b.input_tokens, b.allowance, b.total) == (n, 300, n + 300)
    assert est.estimate(messages, stage="draft", expected_output=50) == n + 50  # a per-call prior wins
    assert est.estimate(messages, stage="final") == n
    assert est.estimate(input_tokens=1000, stage="final") == 1000
    assert est.version == "learned(o200k_base)#00000000"
    est.observe("draft", 1000, 1450)
    assert est.estimate(1000, stage="draft") == 1450 and est.version != "learned(o200k_base)#00000000"
    assert b.version == "learned(o200k_base)#00000000"


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: learned(ledger=False, window=0), "window"),
        (lambda: learned(ledger=False, min_jobs=True), "min_jobs"),
        (lambda: learned(ledger=False, tolerance=1.5), "tolerance"),
        (lambda: learned(ledger=False, prior=-5), "prior"),
        (lambda: learned(ledger=False, prior={"d": 2.5}), "prior for stage 'd'"),
        (lambda: learned(ledger=False, refresh=-1), "refresh"),
        (lambda: learned(ledger=False).observe("d", -1, 10), "input_tokens"),
        (lambda: learned(ledger=False).estimate(input_tokens=-3, stage="d"), "input_tokens"),
        (lambda: learned(ledger=False).estimate(3.5, stage="d"), "prompt"),
    ],
)
def test_bad_options_and_inputs_name_the_field(call, field):
    with pytest.raises(InvalidInput, match=field):
        call()


def _run_stage(led: Ledger, est, stage: str, n: int, rng: random.Random, *, true_output: int, shadow=None) -> None:
    """Submit, admit and settle ``n`` jobs whose prompts are counted by ``est`` (the admission estimate)."""
    for _ in range(n):
        prompt = "word " * rng.randrange(50, 400)
        primary, shadows = (est, []) if shadow is None else (shadow, [est])
        kw = submit_kwargs(primary, shadows, prompt, stage=stage)
        jid = led.submit(stage, **kw)
        assert jid in {x.job_id for x in led.tick("free")}
        actual = kw["est_input"] + max(0, round(true_output * rng.lognormvariate(0, 0.6)))
        led.settle(jid, actual)


def test_refit_learns_from_the_ledger_and_every_process_sees_it(ledger_url):
    led = Ledger(ledger_url)
    led.set_lane("free", allowance=10**12, ceiling=10**12, burst_tokens=10**12, max_leased=10_000)
    est = learned("gpt-4o", ledger=led, min_jobs=20)
    rng = random.Random(3)
    _run_stage(led, est, "critique", 300, rng, true_output=700)
    assert led.output_samples(window=1000)["critique"][0][0] > 0  # est_input was recorded at intake
    result = refit(led)
    assert result.before == "00000000" and result.after != result.before
    old, new = result.changed["critique"]
    assert old is None and abs(new - statistics.fmean(a - i for i, a in led.output_samples()["critique"])) <= 0.5
    est.sync(force=True)
    assert est.allowance("critique") == new and est.version.endswith("#" + result.after)
    [row] = led.estimator_state("learned")
    assert (row["stage"], row["allowance"], row["revision"], row["jobs"]) == ("critique", new, result.after, 300)
    assert row["m2"] > 0 and row["p50"] < row["mean"] < row["p99"]  # lognormal: mean above the median
    assert result.outcome() == f"version #00000000 -> #{result.after}"
    assert refit(led).changed == {}  # the same jobs: nothing moves, the version stays
    assert refit(led).outcome() == "version unchanged"
    # another process (or machine) estimating with the same ledger reads the same state and version
    code = (
        "import json, sys; from lane_plugin.estimators import learned\n"
        "e = learned('gpt-4o', ledger=sys.argv[1])\n"
        "print(json.dumps([e.allowance('critique'), e.version, e.estimate(1000, stage='critique')]))"
    )
    out = subprocess.run([sys.executable, "-c", code, ledger_url], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [new, est.version, 1000 + new]


def test_a_refit_with_nothing_to_learn_from_says_so(tmp_path):
    # the drift-report flow logged "version unchanged" for a ledger no learned estimator had written to
    result = refit(Ledger(f"sqlite:///{tmp_path / 'empty.db'}"))
    assert not result.fits and result.outcome().startswith("nothing to learn from: no done job recorded")


def test_a_learned_shadow_learns_while_another_estimator_admits(ledger_url):
    led = Ledger(ledger_url)
    led.set_lane("free", allowance=10**12, ceiling=10**12, burst_tokens=10**12, max_leased=10_000)
    base = TextLength(expected_output={"critique": 250})
    cal = calibrated(base)
    est = learned("gpt-4o", ledger=led)
    _run_stage(led, est, "critique", 60, random.Random(5), true_output=700, shadow=cal)
    versions = {r["version"] for r in led.shadow_estimates()}
    assert versions == {"learned(o200k_base)#00000000"}
    assert {r["est_version"] for r in led.settled_jobs()} == {cal.version}
    assert est.refit().changed["critique"][1] > 400


def test_jobs_billed_by_estimate_are_never_learned_from(ledger_url):
    led = Ledger(ledger_url)
    for actual, by_estimate in [(1500, False)] * 20 + [(100_000, True)] * 20:
        jid = led.submit("draft", 1000, est_input=1000)
        led.tick("free")
        led.settle(jid, actual, by_estimate=by_estimate)
    assert refit(led, min_jobs=20).changed == {"draft": (None, 500)}


def test_calibrated_ignores_jobs_billed_by_estimate_too(ledger_url):
    led = Ledger(ledger_url)
    base = Constant({"draft": 1000})
    cal = calibrated(base, min_jobs=5)
    for actual, by_estimate in [(2000, False)] * 5 + [(1000, True)] * 20:
        jid = led.submit("draft", **{k: v for k, v in submit_kwargs(base, [], stage="draft").items() if k != "shadows"})
        led.tick("free")
        led.settle(jid, actual, by_estimate=by_estimate)
    assert cal.refit(led) == {"draft": 2.0}


def test_a_biased_stage_reaches_drift_one_once_learned():
    """The example pipeline's situation: the estimate expects 250 output tokens, the model writes ~700."""
    est = learned(encoding="o200k_base", ledger=False, min_jobs=20)
    rng = random.Random(11)
    est_sum = act_sum = 0
    for i in range(1200):
        inp = rng.randrange(200, 2000)
        actual = inp + round(700 * rng.lognormvariate(-0.08, 0.4))
        if i >= 200:
            est_sum += est.estimate(inp, stage="critique")
            act_sum += actual
        est.observe("critique", inp, actual)
    assert abs(act_sum / est_sum - 1) <= 0.05
