"""The drift report: the article's numbers, version grouping with shadows, windows, formats, plot."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lane_plugin import InvalidInput, Ledger
from lane_plugin.reports import drift, drift_over_time, render, summary_markdown, verdict, worst

from ..tables import ARTICLE_SQL


@pytest.fixture
def led(tmp_path, clock):
    led = Ledger(f"sqlite:///{tmp_path / 'lane.db'}", clock=clock)
    led.set_lane("free", allowance=10**9, ceiling=10**9, burst_tokens=10**8, max_leased=100_000)
    yield led
    led.close()


def run_jobs(led, stage, pairs, *, version=None, shadows=None, lane="free"):
    """Submit, lease and settle one job per (est, actual); returns the job ids."""
    ids = []
    for i, (est, _actual) in enumerate(pairs):
        sh = shadows[i] if shadows else None
        ids.append(led.submit(stage, est, lane, est_version=version, shadows=sh))
    leased = {x.job_id for x in led.tick(lane)}
    assert set(ids) <= leased
    for jid, (_, actual) in zip(ids, pairs):
        led.settle(jid, actual)
    return ids


def article(led):
    cols, rows = led.rows(ARTICLE_SQL)
    return {r[0]: dict(zip(cols, r)) for r in rows}


@pytest.fixture
def any_led(ledger_url, clock):
    """The same ledger on SQLite and (when LANE_TEST_POSTGRES_URL is reachable) PostgreSQL."""
    led = Ledger(ledger_url, clock=clock)
    led.set_lane("free", allowance=10**9, ceiling=10**9, burst_tokens=10**8, max_leased=100_000)
    yield led
    led.close()


def test_drift_agrees_with_the_articles_sql(any_led):
    led = any_led
    run_jobs(led, "draft", [(1000, 1900), (2000, 3100), (500, 700), (900, 2000)])
    run_jobs(led, "review", [(300, 150), (300, 150), (700, 300)])
    run_jobs(led, "summarize", [(1234, 1300)])
    # a waiting and a failed job are not 'done': neither side may count them
    led.submit("draft", 5000)
    failed = led.submit("review", 100)
    led.tick("free")
    led.settle(failed, 999, outcome="failed")
    ours = drift(led).set_index("stage").to_dict("index")
    theirs = article(led)
    assert set(ours) == set(theirs) == {"draft", "review", "summarize"}
    for stage, row in theirs.items():
        assert ours[stage]["jobs"] == row["jobs"]
        assert ours[stage]["est_tokens"] == row["est_tokens"]
        assert ours[stage]["actual_tokens"] == row["actual_tokens"]
        assert ours[stage]["drift"] == float(row["drift"])  # PostgreSQL returns numeric (Decimal)
    assert ours["draft"]["drift"] == round(7700 / 4400, 2)
    assert ours["draft"]["verdict"].startswith("overspends")
    assert ours["review"]["verdict"].startswith("wastes")  # 600 / 1300 = 0.46
    assert ours["summarize"]["verdict"] == "honest"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 10**6), st.integers(0, 3 * 10**6)),
        min_size=1,
        max_size=12,
    )
)
def test_drift_equals_article_sql_on_random_jobs(tmp_path_factory, jobs):
    led = Ledger(f"sqlite:///{tmp_path_factory.mktemp('h') / 'lane.db'}")
    led.set_lane("free", allowance=10**9, ceiling=10**9, burst_tokens=10**9, max_leased=100_000)
    for stage, est, actual in jobs:
        run_jobs(led, stage, [(est, actual)])
    ours = drift(led).set_index("stage")
    for stage, row in article(led).items():
        assert (ours.loc[stage, "jobs"], ours.loc[stage, "est_tokens"], ours.loc[stage, "actual_tokens"]) == (
            row["jobs"],
            row["est_tokens"],
            row["actual_tokens"],
        )
        assert ours.loc[stage, "drift"] == row["drift"], (stage, row)
    led.close()


def test_percentiles_and_overage(led):
    run_jobs(led, "draft", [(100, 100), (100, 200), (100, 300), (100, 400), (100, 500)])
    row = drift(led).iloc[0]
    assert row["p50"] == 3.0
    assert row["p90"] == pytest.approx(4.6)
    assert row["overage_tokens"] == 0 + 100 + 200 + 300 + 400


def test_version_grouping_compares_shadows_on_the_same_jobs(led):
    pairs = [(1000, 1800), (1000, 2000), (1000, 2200)]
    shadows = [{"cal#1": 2000}, {"cal#1": 2000}, {"cal#1": 2000}]
    run_jobs(led, "draft", pairs, version="const-v1", shadows=shadows)
    run_jobs(led, "draft", [(1000, 900)], version="const-v1")  # no shadow: counts for const-v1 only
    rep = drift(led, by="stage,version")
    assert list(rep.columns[:3]) == ["stage", "version", "role"]
    rows = rep.set_index("version").to_dict("index")
    assert rows["const-v1"]["role"] == "admission"
    assert rows["const-v1"]["jobs"] == 4
    assert rows["const-v1"]["drift"] == round(6900 / 4000, 2)
    assert rows["cal#1"]["role"] == "shadow"
    assert rows["cal#1"]["jobs"] == 3
    assert rows["cal#1"]["est_tokens"] == 6000
    assert rows["cal#1"]["drift"] == 1.0
    assert rows["cal#1"]["overage_tokens"] == 200  # what it would have overrun: the 2200 job
    # est_version grouping ignores shadows
    assert drift(led, by=["est_version"])["est_version"].tolist() == ["const-v1"]
    md = summary_markdown(rep)
    assert "cal#1" in md and "switch admission" in md


def test_window_and_lane_filters(led, clock):
    led.set_lane("paid", allowance=10**9, ceiling=10**9, burst_tokens=10**8, max_leased=1000)
    run_jobs(led, "draft", [(100, 300)])
    clock.t += 2 * 86400
    run_jobs(led, "draft", [(100, 100)])
    run_jobs(led, "draft", [(100, 50)], lane="paid")
    assert drift(led)["jobs"].tolist() == [3]
    assert drift(led, since="24h")["actual_tokens"].tolist() == [150]
    assert drift(led, since="24h", lane="free")["drift"].tolist() == [1.0]
    by_lane = drift(led, by=["lane", "stage"])
    assert by_lane[["lane", "jobs"]].values.tolist() == [["free", 2], ["paid", 1]]


def test_bad_options_name_the_field(led):
    with pytest.raises(InvalidInput, match="group by 'colour'"):
        drift(led, by=["colour"])
    with pytest.raises(InvalidInput, match="since 'yesterday'"):
        drift(led, since="yesterday")
    with pytest.raises(InvalidInput, match="format 'xml'"):
        render(drift(led), "xml")
    with pytest.raises(InvalidInput, match="not both"):
        drift(led, by="version,est_version")


def test_empty_ledger_reports_nothing_without_failing(led, tmp_path):
    rep = drift(led, by="stage,version")
    assert rep.empty and "role" in rep.columns
    assert render(rep) == "no settled jobs yet"
    assert worst(rep) is None
    assert "nothing to report" in summary_markdown(rep)
    from lane_plugin.reports import plot_drift

    out = plot_drift(drift_over_time(led), tmp_path / "empty.png")
    assert (tmp_path / "empty.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.endswith("empty.png")


def test_formats_round_trip(led):
    run_jobs(led, "draft", [(100, 160), (100, 140)])
    rep = drift(led)
    assert json.loads(render(rep, "json"))[0]["drift"] == 1.5
    csv = render(rep, "csv").splitlines()
    assert csv[0].startswith("stage,jobs,est_tokens,actual_tokens,drift") and csv[1].startswith("draft,2,200,300,1.5")
    md = render(rep, "markdown").splitlines()
    assert md[0].startswith("| stage | jobs") and md[2].startswith("| draft | 2 | 200 | 300 | 1.5 |")


def test_drift_over_time_and_plot(led, clock, tmp_path):
    for hour in range(6):
        clock.t += 3600
        run_jobs(led, "draft", [(100, 100 + 20 * hour)])
        run_jobs(led, "review", [(100, 100)])
    series = drift_over_time(led, buckets=6)
    draft = series[series["stage"] == "draft"]["drift"].round(2).tolist()
    assert draft == [1.0, 1.2, 1.4, 1.6, 1.8, 2.0]
    from lane_plugin.reports import plot_drift

    plot_drift(series, tmp_path / "sub" / "drift.png")
    assert (tmp_path / "sub" / "drift.png").stat().st_size > 5000
    with pytest.raises(InvalidInput, match="plot"):
        plot_drift(series, tmp_path / "drift.jpg")


def test_a_time_axis_of_one_instant_shows_that_time_not_midnight():
    # one settled job: matplotlib widened the axis to whole days and labelled every tick 00:00
    import datetime as dt

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lane_plugin.reports.plots import time_axis

    at = dt.datetime(2026, 11, 30, 14, 37, 12, tzinfo=dt.timezone.utc)
    fig, ax = plt.subplots()
    try:
        ax.plot([at], [1.2], marker="o")
        label = time_axis(ax, [at])
        fig.canvas.draw()
        ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    finally:
        plt.close(fig)
    assert len(ticks) >= 3 and all(t.startswith(("14:3", "14:4")) for t in ticks), ticks
    assert label == "time finished, UTC (hours:minutes, 2026-11-30)"


def test_worst_is_ratio_symmetric_and_verdicts():
    import pandas as pd

    rep = pd.DataFrame(
        {
            "stage": ["a", "b"],
            "jobs": [1, 1],
            "drift": [1.6, 0.3],
            "p50": [1, 1],
            "p90": [1, 1],
            "overage_tokens": [0, 0],
        }
    )
    assert worst(rep)["stage"] == "a"  # the overspender leads, though 0.3 is further from 1.0
    assert worst(rep[rep["stage"] == "b"])["stage"] == "b"  # with no overspender, the underspender does
    assert verdict(1.0) == "honest" and verdict(1.51) == "overspends" and verdict(0.5) == "wastes room"
    assert verdict(None) == "no data"


def test_cli_report_by_version_and_plot(led, tmp_path):
    from typer.testing import CliRunner

    from lane_plugin.cli import app

    run_jobs(led, "draft", [(1000, 1900), (1000, 2100)], version="const-v1", shadows=[{"cal#1": 2000}] * 2)
    url = str(led.url.raw)
    res = CliRunner().invoke(
        app, ["--db", url, "report", "--by", "stage,version", "--format", "csv", "--plot", str(tmp_path / "d.png")]
    )
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("stage", "draft"))]
    assert lines[0].startswith("stage,version,role,jobs")
    assert lines[1].startswith("draft,const-v1,admission,2,2000,4000,2.0")
    assert lines[2].startswith("draft,cal#1,shadow,2,4000,4000,1.0")
    assert (tmp_path / "d.png").stat().st_size > 5000
