"""The `lane` CLI as a shell user drives it: real subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lane_plugin import Ledger
from lane_plugin.ledger.schema import HEAD_REVISION

from .stderr import error_lines


def test_the_articles_loop_submit_tick_settle_report(run):
    ids = [run("submit", "--stage", "draft", "--est", str(500 + 700 * i)).stdout for i in range(5)]
    assert all(len(i.strip()) == 32 and i.endswith("\n") and i.count("\n") == 1 for i in ids)
    leased = json.loads(run("tick", "--json").stdout)
    assert [x["est"] for x in leased] == [500, 1200, 1900, 2600, 3300]  # smallest first
    assert set(leased[0]) >= {"id", "stage", "est", "lane", "lease_until"}
    out = run("settle", leased[0]["id"], "--actual", "5120").stdout
    assert "5120 tokens" in out and "overage 4620" in out
    again = run("settle", leased[0]["id"], "--actual", "5120").stdout
    assert "replay: billed nothing" in again
    other = run("settle", leased[0]["id"], "--actual", "1", check=False)  # another actual: not a replay
    assert other.returncode == 6 and "already settled with 5120" in other.stderr
    report = run("report").stdout
    assert "draft" in report and "10.24" in report
    lanes = json.loads(run("lanes", "--json").stdout)
    free = next(x for x in lanes if x["lane"] == "free")
    assert free["spent"] == 5120 and free["reserved"] == 1200 + 1900 + 2600 + 3300
    assert run("audit").stdout.strip() == "ledger sound: I1-I7 hold"


@pytest.mark.parametrize(
    "args, code, needle",
    [
        (["submit", "--stage", "s", "--est", "0"], 2, "invalid est 0"),
        (["submit", "--stage", "s", "--est", "-4"], 2, "invalid est -4"),
        (["submit", "--stage", "s", "--est", "99999999999999"], 2, "absurdly large"),
        (["submit", "--stage", "s", "--est", "50000"], 4, "burst of 40000"),
        (["submit", "--stage", "s", "--est", "10", "--lane", "nolane"], 3, "unknown lane 'nolane'"),
        (["settle", "nojob", "--actual", "5"], 3, "unknown job 'nojob'"),
        (["settle", "nojob", "--actual", "-5"], 2, "invalid actual -5"),
        (["lanes", "set", "free", "--ceiling", "0"], 2, "invalid ceiling 0"),
        (["lanes", "set", "free", "--period", "weekly"], 2, "invalid period 'weekly'"),
        (["lanes", "set", "free", "--overtake-slack", "0.5"], 2, "invalid overtake_slack 0.5"),
        (["lanes", "set", "free", "--overtake-slack", "fast"], 2, "invalid overtake_slack 'fast'"),
        (["lanes", "set", "free", "--overtake-q", "-1"], 2, "invalid overtake_q -1"),
        (["lanes", "set", "free", "--overtake-q", "many"], 2, "invalid overtake_q 'many': expected a whole number"),
        (["lanes", "set", "free", "--overtake-q", "5.0"], 2, "invalid overtake_q '5.0'"),
        (["lanes", "set", "free", "--overtake-q", "\u0663"], 2, "or learn"),  # an Arabic-Indic 3: not taken as 3
        (["lanes", "set", "free", "--overtake-slack", "fast"], 2, "expected a number from 1 to 10, or off"),
        (["lanes", "set", "free", "--limit", "requests=500"], 2, "limit 'requests=500'"),
        (["lanes", "set", "free", "--limit", "rpm=5/60s"], 2, "unknown unit 'rpm'"),
        (["lanes", "set", "free", "--limit", "requests=0/60s"], 2, "must be a positive integer"),
        (["lanes", "set", "free", "--limit", "requests"], 2, "expected UNIT=AMOUNT/WINDOW"),
        # the value as given, once (not the list of every --limit), and what is wrong with it
        (["lanes", "set", "free", "--limit", "tokens=5/0s"], 2, "invalid limit 'tokens=5/0s': the window must be"),
        (["lanes", "set", "free", "--limit", "foo=1/1s"], 2, "invalid limit 'foo=1/1s': unknown unit 'foo'"),
        (["lanes", "set", "free", "--limit", "requests=-5/60s"], 2, "positive integer, got -5"),
        # too large for the database (a traceback once) or for a stored spec to read back
        (["lanes", "set", "free", "--limit", "requests=99999999999999999999999/60s"], 2, "at most 1,000,000,000,000"),
        (["lanes", "set", "free", "--limit", "tokens=99999999999999999999/60s"], 2, "at most 1,000,000,000,000"),
        (["lanes", "set", "free", "--limit", "requests=5/99999999999999999999s"], 2, "from 1ms to a year"),
        (["lanes", "set", "free", "--limit", "requests=5/0.00001s"], 2, "from 1ms to a year"),
        (["lanes", "set", "free", "--limit", "requests=5/60s", "--limit", "requests=6/60s"], 2, "limited twice"),
        (["lanes", "set", "free", "--limit", "tokens=5000/60s", "--burst-tokens", "30"], 2, "choose one"),
        (["--db", "mysql://u:hunter2@h/db", "lanes"], 2, "unsupported scheme"),
        (["--db", "postgresql+psycopg://u:hunter2@127.0.0.1:1/db", "lanes"], 8, "cannot connect"),
    ],
)
def test_bad_input_is_one_line_with_a_shell_exit_code(run, args, code, needle):
    p = run(*args, check=False)
    assert p.returncode == code, p.stderr
    lines = error_lines(p.stderr)
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert "Traceback" not in p.stderr and "hunter2" not in p.stderr + p.stdout


def test_non_integer_estimate_is_a_usage_error(run):
    p = run("submit", "--stage", "s", "--est", "1.5", check=False)
    assert p.returncode == 2
    assert p.stderr.strip().startswith("lane: error: Invalid value for '--est'")  # before any ledger is read
    assert len(p.stderr.strip().splitlines()) == 1


def test_settling_a_job_never_leased_is_refused_and_bills_nothing(run):
    jid = run("submit", "--stage", "s", "--est", "10").stdout.strip()
    p = run("settle", jid, "--actual", "10", check=False)
    assert p.returncode == 5 and "never leased" in p.stderr
    assert json.loads(run("lanes", "--json").stdout)[0]["spent"] == 0


def test_lanes_set_and_tail(run):
    out = run("lanes", "set", "free", "--ceiling", "6000000", "--fallback", "paid").stdout
    assert "ceiling 6,000,000" in out and "fallback paid" in out
    jid = run("submit", "--stage", "s", "--est", "10", "--wait", "0").stdout.strip()
    run("lanes", "set", "free", "--stop")
    assert "ceiling-spent" not in run("lanes").stdout  # an operator stop reads STOPPED
    assert "STOPPED" in run("lanes").stdout
    import time

    time.sleep(0.01)
    assert "parked 1" in run("reap", "--overdue").stdout
    tail = json.loads(run("tail", "--json").stdout)
    assert [t["job_id"] for t in tail] == [jid] and tail[0]["reason"] == "deadline passed while waiting"
    assert jid in run("tail").stdout
    run("tail", "requeue", jid)
    assert json.loads(run("tail", "--json").stdout) == []
    run("lanes", "set", "free", "--resume")


def test_db_upgrade_and_help(run):
    assert f"schema at revision {HEAD_REVISION}" in run("db", "upgrade").stdout
    for cmd in (["--help"], ["submit", "--help"], ["lanes", "set", "--help"], ["tail", "--help"]):
        assert "Usage" in run(*cmd).stdout


def test_the_cli_imports_neither_prefect_nor_pandas_for_the_hot_commands(tmp_path):
    code = (
        "import sys; from lane_plugin import cli; "
        "sys.argv=['lane','--db','sqlite:///" + str(tmp_path / "x.db") + "','submit','--stage','s','--est','5']\n"
        "try:\n cli.main()\nexcept SystemExit: pass\n"
        "bad=[m for m in ('prefect','pandas','sqlalchemy','sqlmodel','numpy','urllib.request') if m in sys.modules]\n"
        "print('LOADED', bad)"
    )
    Path(tmp_path / "x.db")  # created (and migrated) by the first call, which may import alembic
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "LOADED []" in out


def test_rate_cost_and_rate_basis_from_the_shell(run):
    run("lanes", "set", "free", "--burst-tokens", "1000", "--window-seconds", "60", "--rate-basis", "actual")
    a = run("submit", "--stage", "s", "--est", "100", "--rate-cost", "700").stdout.strip()
    run("submit", "--stage", "s", "--est", "100", "--rate-cost", "700")
    [lease] = json.loads(run("tick", "--json").stdout)  # 700 + 700 > 1,000 in the sliding window
    assert (lease["id"], lease["est"], lease["rate_cost"]) == (a, 100, 700)
    run("settle", a, "--actual", "150")  # the provider counted 150: the window is trued up
    assert [x["rate_cost"] for x in json.loads(run("tick", "--json").stdout)] == [700]
    free = next(x for x in json.loads(run("lanes", "--json").stdout) if x["lane"] == "free")
    assert (free["window_used"], free["rate_basis"], free["reserved"]) == (850, "actual", 100)
    p = run("submit", "--stage", "s", "--est", "10", "--rate-cost", "1001", check=False)
    assert p.returncode == 4 and "rate cost 1001 exceeds the lane's burst of 1000" in p.stderr
    p = run("lanes", "set", "free", "--rate-basis", "tokens", check=False)
    assert p.returncode == 2 and "invalid rate_basis 'tokens'" in p.stderr


def test_tenants_list_set_and_refuse(run):
    """`lane tenants`: weights and budgets per tenant of a lane; bad weight, unknown lane and a typo refused."""
    run("submit", "--stage", "s", "--est", "100", "--tenant", "interactive")
    run("submit", "--stage", "s", "--est", "100", "--tenant", "backfill")
    out = run("tenants", "set", "free", "interactive", "--weight", "4", "--ceiling", "2000000", "--period", "daily")
    assert "weight 4" in out.stdout and "ceiling 2,000,000 (daily)" in out.stdout
    rows = {t["tenant"]: t for t in json.loads(run("tenants", "free", "--json").stdout)}
    assert (rows["interactive"]["weight"], rows["interactive"]["ceiling"], rows["interactive"]["waiting"]) == (
        4.0,
        2_000_000,
        1,
    )
    assert rows["backfill"]["weight"] == 1.0 and rows["backfill"]["ceiling"] is None
    assert "interactive" in run("tenants").stdout and "tenant interactive" not in run("tenants").stdout
    typo = run("tenants", "set", "free", "interactiv", "--weight", "2", check=False)
    # an unknown tenant is exit 3, as an unknown lane (docs/cli.md's exit codes), naming the lane and the closest
    assert typo.returncode == 3 and "unknown tenant 'interactiv' in lane 'free'" in typo.stderr, typo.stderr
    assert "did you mean 'interactive'?" in typo.stderr and "--create" in typo.stderr
    assert run("tenants", "set", "free", "nightly", "--create", "--weight", "2").returncode == 0
    period_only = run("tenants", "set", "free", "nightly", "--period", "daily").stdout
    assert "no ceiling (period daily" in period_only, period_only  # what was set is said back
    for weight in ("0", "-1", "1001", "nan"):
        bad = run("tenants", "set", "free", "backfill", "--weight", weight, check=False)
        assert bad.returncode == 2 and "invalid weight" in bad.stderr, bad.stderr
    lane = run("tenants", "set", "fre", "backfill", "--weight", "2", check=False)
    assert lane.returncode == 3 and "unknown lane 'fre'" in lane.stderr and "did you mean 'free'?" in lane.stderr
    assert run("tenants", "fre", check=False).returncode == 3
    both = run("tenants", "set", "free", "backfill", "--ceiling", "5", "--no-ceiling", check=False)
    assert both.returncode == 2 and "--no-ceiling" in both.stderr
    assert run("audit").stdout.strip() == "ledger sound: I1-I7 hold"


def test_a_lane_named_set_has_its_tenants_listed_with_the_lane_option(run):
    """`lane tenants set` is the subcommand: a lane named `set` is listed with --lane, and the bare subcommand says
    so instead of click's bare "Missing argument"."""
    run("lanes", "set", "set", "--create", "--allowance", "1000", "--ceiling", "1000")
    run("submit", "--stage", "s", "--est", "100", "--lane", "set", "--tenant", "ops")
    rows = json.loads(run("tenants", "--lane", "set", "--json").stdout)
    assert [(t["lane"], t["tenant"]) for t in rows] == [("set", "ops")]
    bare = run("tenants", "set", check=False)
    assert bare.returncode == 2 and "lane tenants --lane set" in bare.stderr, bare.stderr
    two = run("tenants", "free", "--lane", "set", check=False)
    assert two.returncode == 2 and "LANE 'free' and --lane 'set' name two lanes" in two.stderr, two.stderr


def test_tenants_usage_lines_name_each_form_once(run):
    """`lane tenants set --help` read `lane tenants [lane] set [OPTIONS] {lane} {tenant}`: the group's optional
    LANE leaked into the subcommand's path. Each usage line now says what to type."""
    usage = run("tenants", "set", "--help").stdout.splitlines()[0]
    assert usage == "Usage: lane tenants set [OPTIONS] {LANE} {TENANT}", usage
    group = run("tenants", "--help").stdout
    usage = group.splitlines()[0]
    assert usage == "Usage: lane tenants [OPTIONS] [LANE] | set {LANE} {TENANT} [OPTIONS]", usage
    assert group.rstrip().endswith("set  Give a tenant a weight or a budget."), group  # not cut at "e.g."
    missing = run("tenants", "set", "free", check=False)
    assert missing.returncode == 2 and "Missing argument 'TENANT'" in missing.stderr, missing.stderr


def test_a_tenant_ceiling_under_what_it_admitted_needs_force(run):
    jid = run("submit", "--stage", "s", "--est", "500", "--tenant", "team").stdout.strip()
    run("tick")
    run("settle", jid, "--actual", "500")
    bad = run("tenants", "set", "free", "team", "--ceiling", "100", check=False)
    assert bad.returncode == 2 and "under the 500 tokens it has already admitted" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr and run("audit").returncode == 0
    out = run("tenants", "set", "free", "team", "--ceiling", "100", "--force").stdout
    assert "ceiling 100 (no period: never resets), spent 500" in out


def test_a_lanes_set_that_parks_waiting_jobs_says_so(run):
    big = run("submit", "--stage", "s", "--est", "1000").stdout.strip()
    small = run("submit", "--stage", "s", "--est", "10").stdout.strip()
    out = run("lanes", "set", "free", "--limit", "tokens=500/60s").stdout
    assert "parked 1 waiting job(s) the new settings leave no way to fit" in out  # once: nothing said
    assert "estimate 1000 exceeds the lane's burst of 500" in out and "lane tail --lane free" in out
    assert [t["job_id"] for t in json.loads(run("tail", "--json").stdout)] == [big]
    quiet = run("lanes", "set", "free", "--limit", "tokens=400/60s", "--json").stdout
    assert json.loads(quiet)["parked"] == [] and small not in quiet  # the small job still fits: nothing parked


def test_limits_are_set_shown_and_dropped_from_the_cli(run):
    out = run(
        "lanes",
        "set",
        "free",
        "--limit",
        "requests=500/60s",
        "--limit",
        "tokens=30000/1m",
        "--limit",
        "output_tokens=8000/60s",
    ).stdout
    assert "burst 30,000 per 1m, limits requests 500/60s, output_tokens 8000/60s" in out
    free = next(x for x in json.loads(run("lanes", "--json").stdout) if x["lane"] == "free")
    assert free["limits"] == ["tokens 30000/60s", "requests 500/60s", "output_tokens 8000/60s"]
    assert free["burst_tokens"] == 30000 and free["window_seconds"] == 60.0
    assert "requests 500/60s" in run("lanes", "--wide").stdout
    run("lanes", "set", "free", "--limit", "requests=none")
    free = next(x for x in json.loads(run("lanes", "--json").stdout) if x["lane"] == "free")
    assert free["limits"] == ["tokens 30000/60s", "output_tokens 8000/60s"]
    status = run("status", "free").stdout
    assert "limits: tokens 30000/60s (used 0), output_tokens 8000/60s (used 0)" in status


def test_rule_12_is_on_for_a_new_lane_learning_from_its_creation_and_off_turns_it_off(run):
    out = " ".join(run("lanes", "set", "fresh", "--create", "--ceiling", "1000", "--allowance", "2000").stdout.split())
    assert "rule 12: p99 of tokens ahead within 1.25x first come, first served's" in out, out
    assert "learning the p99 backlog from the arrivals until" in out, out
    data = json.loads(run("status", "fresh", "--json").stdout)
    assert (data["overtake_slack"], data["overtake_q"]) == (1.25, None) and data["overtake_since"].endswith("Z")
    out = run("lanes", "set", "fresh", "--overtake-slack", "OFF").stdout
    assert "rule 12" not in out, out
    data = json.loads(run("status", "fresh", "--json").stdout)
    assert (data["overtake_slack"], data["overtake_since"]) == (None, None)
    out = " ".join(run("lanes", "set", "fresh", "--overtake-slack", "1.5").stdout.split())
    assert "within 1.5x" in out and "learning the p99 backlog from the arrivals until" in out, out


def test_lanes_set_says_rule_12_learns_a_day_before_it_binds_and_takes_a_seed(run, env):
    # lane free of a new ledger: on by migration 0020, its learning day starts at its first refit (the ledger's clock)
    run("db", "upgrade")
    out = " ".join(run("status", "free").stdout.split())
    assert "learning the p99 backlog from the lane's next refit on: binds a day later" in out, out
    run("lanes", "set", "free", "--overtake-slack", "off")
    out = " ".join(run("lanes", "set", "free", "--overtake-slack", "1.25").stdout.split())
    assert "rule 12: p99 of tokens ahead within 1.25x first come, first served's" in out, out
    assert "learning the p99 backlog from the arrivals until 20" in out and "binds once learned" in out, out
    out = " ".join(run("lanes", "set", "free", "--overtake-q", "4000").stdout.split())
    assert "(p99 backlog 4,000 rate tokens)" in out, out
    status = " ".join(run("status", "free").stdout.split())
    assert "(p99 backlog 4,000 rate tokens)" in status, status
    data = json.loads(run("status", "free", "--json").stdout)
    assert (data["overtake_slack"], data["overtake_q"]) == (1.25, 4000) and data["overtake_since"].endswith("Z")
    out = " ".join(run("lanes", "set", "free", "--overtake-q", "learn").stdout.split())
    assert "learning the p99 backlog from the arrivals until" in out, out
    # (outside review) past its day with too few arrivals to learn from, it does not name a date gone by
    Ledger(env["LANE_DATABASE_URL"]).db.transaction(
        lambda cur: cur.execute("update lane set overtake_since = overtake_since - 2 * 86400 where name = 'free'")
    )
    status = " ".join(run("status", "free").stdout.split())
    assert "binds once a day has 200 arrivals" in status and "until" not in status.split("rule 12")[1], status
