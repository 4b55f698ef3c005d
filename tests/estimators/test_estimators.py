"""Estimators: the protocol, the built-ins, calibration and its versions."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lane_plugin import InvalidInput, Ledger
from lane_plugin.errors import TiktokenUnavailable
from lane_plugin.estimators import (
    Calibrated,
    Constant,
    Estimator,
    TextLength,
    Tiktoken,
    base_samples,
    calibrated,
    load_local_encoding,
    submit_kwargs,
)
from lane_plugin.reports import drift


def test_builtins_follow_the_protocol():
    for est in (Constant({"a": 1}), TextLength(), calibrated(Constant({"a": 1}))):
        assert isinstance(est, Estimator)
        assert est.name and est.version
        assert isinstance(est.estimate(stage="a"), int)


def test_constant():
    c = Constant({"draft": 1200, "review": 300}, version="2024-06")
    assert c.estimate(stage="draft") == 1200 and c.estimate("ignored", stage="review") == 300
    assert c.version == "const-2024-06"
    with pytest.raises(InvalidInput, match="stage 'other'.*known: draft, review"):
        c.estimate(stage="other")
    assert Constant({}, default=7).estimate(stage="x") == 7
    with pytest.raises(InvalidInput, match="estimate for stage 'draft'"):
        Constant({"draft": 0})
    with pytest.raises(InvalidInput, match="estimate for stage 'draft'"):
        Constant({"draft": 1.5})
    with pytest.raises(InvalidInput, match="per_stage"):
        Constant([("draft", 1)])


def test_text_length():
    t = TextLength(expected_output={"draft": 500}, version="v3")
    assert t.version == "chars4-v3"
    assert t.estimate("x" * 4000, stage="draft") == 1500
    assert t.estimate("x" * 4000, stage="other") == 1000
    assert t.estimate("x" * 4000, stage="draft", expected_output=0) == 1000
    msgs = [{"role": "system", "content": "abc"}, {"role": "user", "content": "defg"}]
    assert t.estimate(msgs) == 2  # "abc\ndefg" = 8 characters
    assert t.estimate("") == 1  # never 0: the ledger refuses an estimate of 0
    with pytest.raises(InvalidInput, match="text 42"):
        t.estimate(42)
    with pytest.raises(InvalidInput, match="chars_per_token"):
        TextLength(chars_per_token=0)
    with pytest.raises(InvalidInput, match="expected_output -1"):
        TextLength(expected_output=-1)


@given(st.text(max_size=2000), st.integers(0, 10_000))
def test_text_length_is_monotone_in_text(text, out):
    t = TextLength(expected_output=out)
    assert t.estimate(text) <= t.estimate(text + "more words")
    assert t.estimate(text) >= max(1, out)


def test_tiktoken_skips_cleanly_without_a_local_encoding(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    with pytest.raises(TiktokenUnavailable) as err:
        Tiktoken("cl100k_base")
    assert "cl100k_base" in str(err.value)
    assert isinstance(err.value, InvalidInput)  # the CLI's exit code 2, a clear one-line message


def test_tiktoken_counts_when_available(tmp_path, monkeypatch):
    from .test_tokens import _seed_tiktoken_cache

    pytest.importorskip("tiktoken")
    _seed_tiktoken_cache(tmp_path)  # tiktoken's own file, from the vocabulary bpe-openai ships: no download
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert load_local_encoding("cl100k_base").name == "cl100k_base"
    t = Tiktoken("cl100k_base", expected_output=10)
    assert t.version == "tiktoken-cl100k_base-v1"
    assert t.estimate("hello world") == 2 + 10


def test_calibration_learns_a_robust_quantile_and_versions_it():
    base = Constant({"draft": 1000, "review": 100})
    cal = calibrated(base, min_jobs=5)
    v0 = cal.version
    assert v0 == "calibrated(const-v1)#00000000" and cal.estimate(stage="draft") == 1000
    ratios = [1.7, 1.8, 1.8, 1.9, 2.0, 50.0]  # one runaway job must not drag the factor
    changed = cal.learn({"draft": [(1000, int(1000 * r)) for r in ratios], "review": [(100, 90)] * 3})
    assert changed == {"draft": 1.9}
    assert cal.factor("review") == 1.0  # 3 samples < min_jobs: left alone
    assert cal.estimate(stage="draft") == 1900
    v1 = cal.version
    assert v1 != v0
    assert cal.learn({"draft": [(1000, int(1000 * r)) for r in ratios]}) == {}  # same factor: same version
    assert cal.version == v1
    cal.learn({"draft": [(1000, 1100)] * 5})
    assert cal.version not in (v0, v1)
    cal.learn({"draft": [(1000, 1000)] * 5})
    assert cal.version == v0  # the same factors are the same estimator: same version


def test_calibration_version_is_stable_across_instances():
    a = calibrated(Constant({"draft": 1000}), factors={"draft": 1.8, "x": 1.0})
    b = calibrated(Constant({"draft": 1000}), factors={"draft": 1.8})
    assert a.version == b.version != calibrated(Constant({"draft": 1000}), factors={"draft": 1.81}).version
    # rounding to `step` keeps noise from minting a version per refit
    assert calibrated(Constant({"draft": 1}), factors={"draft": 1.8004}).version == b.version


def test_calibration_rejects_bad_options():
    base = Constant({"d": 1})
    with pytest.raises(InvalidInput, match="quantile 0.3"):
        calibrated(base, quantile=0.3)
    with pytest.raises(InvalidInput, match="window 0"):
        calibrated(base, window=0)
    with pytest.raises(InvalidInput, match="factor for stage 'd'"):
        calibrated(base, factors={"d": -1})
    with pytest.raises(InvalidInput, match="base"):
        Calibrated(object())


def test_submit_kwargs_records_shadows_beside_the_admission_estimate():
    base = TextLength(expected_output=100)
    cal = calibrated(base, factors={"draft": 2.0})
    kw = submit_kwargs(cal, [base, cal], "x" * 400, stage="draft")
    assert kw == {"est": 400, "est_version": cal.version, "shadows": {base.version: 200}, "est_input": None}


def test_calibrated_admission_stops_a_drifting_estimator_overspending(tmp_path):
    """End to end on a ledger: plain drift > 1.5; calibrated, refit from the ledger, near 1.0."""
    rng = random.Random(7)
    led = Ledger(f"sqlite:///{tmp_path / 'lane.db'}")
    led.set_lane("free", allowance=10**9, ceiling=10**9, burst_tokens=10**9, max_leased=10_000)
    base = Constant({"draft": 1000})
    cal = calibrated(base)

    def batch(n):
        ids = [led.submit("draft", **submit_kwargs(base, [cal], stage="draft")) for _ in range(n)]
        led.tick("free")
        for jid in ids:
            led.settle(jid, int(1000 * 1.8 * rng.lognormvariate(0, 0.25)))

    batch(200)
    assert cal.refit(led) and 1.6 < cal.factor("draft") < 2.1
    assert len(base_samples(led, base.version)["draft"]) == 200
    fitted = cal.version
    batch(200)
    rep = drift(led, by="stage,version").set_index("version")
    assert rep.loc[base.version, "drift"] > 1.5
    assert abs(rep.loc[fitted, "drift"] - 1.0) <= 0.15
    # a calibrated admission learns from jobs whose base estimate is only a shadow
    led2 = Ledger(f"sqlite:///{tmp_path / 'lane2.db'}")
    led2.set_lane("free", allowance=10**9, ceiling=10**9, burst_tokens=10**9, max_leased=10_000)
    ids = [led2.submit("draft", **submit_kwargs(cal, [base], stage="draft")) for _ in range(30)]
    led2.tick("free")
    for jid in ids:
        led2.settle(jid, 3000)
    cal2 = calibrated(base, min_jobs=30)
    assert cal2.refit(led2) == {"draft": 3.0}
    led.close()
    led2.close()
