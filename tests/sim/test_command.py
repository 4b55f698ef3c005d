"""``lane simulate`` on the command line: sources that conflict, JSON keys, 80 columns, progress."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lane_plugin.cli import app

# The --json keys before issue 11 (main at 2a71afe): they must all stay.
OLD_TOP = {"jobs_per_s", "machine", "results", "scenario", "wall_seconds"}
OLD_SCENARIO = {
    "actual_tokens",
    "config",
    "drift",
    "est_tokens",
    "jobs",
    "refused_at_intake",
    "source",
    "span_hours",
    "top_decile_est_from",
}
OLD_CONFIG = {
    "allowance",
    "burst_tokens",
    "ceiling",
    "count_slots",
    "deadline",
    "horizon",
    "lease_seconds",
    "max_attempts",
    "max_leased",
    "max_wait_seconds",
    "period_seconds",
    "preflight",
    "service_base",
    "service_per_token",
    "sleep_every",
    "sleep_seconds",
    "start_fraction",
    "starve_after",
    "window_seconds",
    "workers",
}
OLD_RESULT = {
    "big_wait_p50",
    "big_wait_p99",
    "busy_pct",
    "done",
    "expired",
    "jobs",
    "jobs_per_s",
    "over_allowance",
    "over_ceiling",
    "parked",
    "peak_period_spent",
    "policy",
    "spent",
    "starved",
    "wait_p50",
    "wait_p99",
    "waiting_at_end",
    "wall_seconds",
}
NEW_RESULT = {
    "over_burst",
    "runs_started",
    "runs_finished",
    "stranded_tokens",
    "budget_used",
    "parked_wait_p50",
    "parked_wait_p99",
    "never_admitted",
    "never_admitted_wait_p50",
    "never_admitted_wait_p99",
}
CALLS = "timestamp_ms,input_length,output_length\n0,1000,30\n500,2000,10\n900,300,400\n"


def run(*args: str):
    return CliRunner().invoke(app, ["simulate", *args])


@pytest.fixture
def calls(tmp_path):
    path = tmp_path / "calls.csv"
    path.write_text(CALLS)
    return str(path)


@pytest.mark.parametrize("flags", [["--jobs", "500"], ["--seed", "3", "--drift", "1.2"], ["--days", "2"]])
def test_trace_with_generator_flags_exits_2_naming_them(calls, flags):
    res = run("--trace", calls, *flags)
    assert res.exit_code == 2
    for flag in flags[::2]:
        assert flag in res.output
    assert "cannot apply to --trace" in res.output and "Traceback" not in res.output


def test_trace_reading_flags_without_a_trace_exit_2():
    res = run("--jobs", "50", "--max-tokens", "1024")
    assert res.exit_code == 2 and "--max-tokens" in res.output and "need(s) --trace" in res.output


def test_from_ledger_with_generator_flags_exits_2():
    res = run("--from-ledger", "--mix", "bimodal")
    assert res.exit_code == 2 and "--mix" in res.output


def test_json_keys_only_grow(calls):
    res = run("--trace", calls, "--json", "--max-tokens", "500")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert OLD_TOP <= set(doc)
    assert OLD_SCENARIO <= set(doc["scenario"]) and OLD_CONFIG <= set(doc["scenario"]["config"])
    for result in doc["results"]:
        assert OLD_RESULT | NEW_RESULT <= set(result)
    lane = next(r for r in doc["results"] if r["policy"] == "lane")
    assert (lane["done"], lane["runs_started"], lane["runs_finished"], lane["stranded_tokens"]) == (3, 3, 3, 0)
    assert doc["scenario"]["rate_cost_tokens"] == 3300 + 3 * 500


def test_generated_json_has_the_same_keys():
    res = run("--jobs", "60", "--days", "0.02", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert all(OLD_RESULT | NEW_RESULT <= set(r) for r in doc["results"])
    assert doc["scenario"]["chained"] is True and doc["scenario"]["runs"] == 20


def test_table_fits_80_columns_and_names_every_figure(calls):
    res = run("--trace", calls)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    header = next(line for line in lines if line.split() == ["count", "token-fifo", "smallest-first", "lane"])
    assert header
    for label in ("budget used", "over burst", "stranded", "runs done/begun", "never admitted", "parked"):
        assert any(line.startswith(label) for line in lines), label


def test_progress_bar_goes_to_stderr_only_when_asked(calls):
    runner = CliRunner()
    res = runner.invoke(app, ["simulate", "--trace", calls, "--progress", "--json"])
    assert res.exit_code == 0
    json.loads(res.stdout)  # stdout stays clean JSON
    assert "simulate lane 4/4 [" in res.stderr
    assert max(len(part) for part in res.stderr.split("\r")) <= 80
    quiet = runner.invoke(app, ["simulate", "--trace", calls, "--json"])  # stderr is not a terminal here
    assert quiet.stderr == ""


def test_bad_trace_row_is_one_line_exit_2(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("timestamp_ms,input_length,output_length\n0,10,1\n1,x,1\n")
    res = run("--trace", str(path))
    assert res.exit_code == 2
    assert "line 3: input_length='x' is not a number" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--jobs", "99999999999"], "jobs=99999999999 must be > 0 and at most 10,000,000"),  # was killed: out of memory
        (["--drift", "nan"], "drift=nan must be a finite number > 0"),  # was "cannot convert float NaN to integer"
        (["--days", "inf"], "days=inf must be a finite number > 0"),  # was "float division by zero"
        (["--days", "nan"], "days=nan must be a finite number > 0"),  # was a run with every arrival at NaN
        (["--median", "0"], "median=0.0 must be a finite number > 0"),  # was a run of 1-token jobs
        (["--median", "-5"], "median=-5.0 must be a finite number > 0"),
        (["--noise", "-1"], "noise=-1.0 must be a finite number >= 0"),  # was read as noise 1
        (["--noise", "nan"], "noise=nan must be a finite number >= 0"),
    ],
)
def test_generator_numbers_out_of_range_exit_2_naming_the_flag(flags, said):
    res = run("--jobs", "30", *flags)
    assert res.exit_code == 2 and said in res.output and "Traceback" not in res.output, res.output


@pytest.mark.parametrize("flags", [["--from-ledger", "--days", "1"], ["--jobs", "30", "--lane", "free"]])
def test_reading_a_ledger_that_is_not_there_creates_none(tmp_path, flags):
    # A typo in --db made an empty ledger there: --from-ledger then said "no settled jobs", --lane ran on
    # the defaults of the lane it had just created, and the stray file stayed.
    db = tmp_path / "typo.db"
    res = run(*flags, "--db", f"sqlite:///{db}")
    assert res.exit_code == 2 and "no ledger at" in res.output, res.output
    assert not db.exists()


def test_overtake_beta_runs_the_budget_and_a_negative_one_is_refused_by_name():
    on = run(
        "--jobs",
        "300",
        "--burst-tokens",
        "20000",
        "--overtake-beta",
        "0.25",
        "--policies",
        "lane,token-fifo",
        "--json",
        "--no-progress",
    )
    assert on.exit_code == 0, on.output
    bad = run("--jobs", "300", "--overtake-beta", "-1", "--no-progress")
    assert bad.exit_code == 2 and "overtake_beta=-1.0 must be >= 0" in bad.output


def test_overtake_slack_runs_the_quantile_form_reports_its_estimate_and_bad_values_are_refused_by_name():
    on = run(
        "--jobs",
        "600",
        "--burst-tokens",
        "20000",
        "--days",
        "1",
        "--overtake-slack",
        "1.3",
        "--policies",
        "lane,token-fifo",
        "--json",
        "--no-progress",
    )
    assert on.exit_code == 0, on.output
    lane = next(r for r in json.loads(on.output)["results"] if r["policy"] == "lane")
    assert lane["slack_estimate_ratio"] is not None and lane["slack_estimate_ratio"] >= 0
    base = ("--jobs", "600", "--burst-tokens", "20000", "--policies", "lane", "--json", "--no-progress")
    assert json.loads(run(*base).output)["results"][0]["slack_estimate_ratio"] is None  # off by default
    base = (*base, "--overtake-slack", "1.25")
    default = json.loads(run(*base, "--days", "1").output)["results"][0]
    assert default["slack_estimate_ratio"] is not None  # on, its second day: Q learned from the first day's 600
    assert default["overtake_q"] is not None and default["learning_seconds"] > 0
    week = json.loads(run(*base).output)["results"][0]  # 600 in a week: the last day has under 200, still learning
    assert (week["overtake_q"], week["slack_estimate_ratio"]) == (None, None)
    learning = json.loads(run(*base, "--overtake-day", "1").output)["results"][0]
    assert learning["slack_estimate_ratio"] is None  # the learning day reads no Q
    off = run(*base, "--overtake-slack", "OFF")
    assert json.loads(off.output)["results"][0]["slack_estimate_ratio"] is None  # off: nothing estimated
    for flags, said in (
        (("--overtake-slack", "0.9"), "overtake_slack=0.9 must be >= 1"),
        (("--overtake-slack", "inf"), "overtake_slack=inf must be >= 1 and finite"),  # not a NaN key's traceback
        (("--overtake-slack", "lots"), "overtake_slack='lots' must be a number >= 1 or off"),
        (("--overtake-day", "3"), "overtake_day=3 must be 0"),
        (("--overtake-beta", "inf"), "overtake_beta=inf must be >= 0 and finite"),
        (("--overtake-slack", "off", "--overtake-learned", "5000"), "overtake_learned=5000 needs overtake_slack set"),
        (("--overtake-slack", "1.3", "--overtake-learned", "-1"), "overtake_learned=-1 must be >= 0"),
        (("--overtake-slack", "1.3", "--overtake-beta", "0.25"), "set one"),
    ):
        bad = run("--jobs", "300", *flags, "--no-progress")
        assert bad.exit_code == 2 and said in bad.output, bad.output
