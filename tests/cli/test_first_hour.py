"""The `lane` CLI in a new user's first hour (issue 26): which ledger, which lane, why parked, what to do.

Each point of the issue is checked as the user met it: a second shell without ``LANE_DATABASE_URL``
read another ledger without saying so; ``lane status mylane`` answered ``unknown job``; a lane with
parked work said ``ok``; a parked job's status gave no reason; ``lane tail requeue`` on a gated job said
``requeued`` and the job was parked again 5 s later; the report's columns were explained nowhere;
``lane tail`` was over 200 characters wide.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lane_plugin import Ledger
from lane_plugin.cli import app, main

from .stderr import LEDGER_LINE, error_lines

ROOT = Path(__file__).resolve().parents[2]
# Commands that read no ledger: they name none (simulate reads one only with --lane or --from-ledger).
NO_LEDGER = {"automations apply"}


@pytest.fixture
def lane(monkeypatch, capsys):
    """``lane(*args, env={...})`` in this process (fast: no interpreter per command): ``(code, out, err)``."""

    def lane(*args: str, env: dict[str, str | None]):
        for k, v in env.items():
            if v is None:
                monkeypatch.delenv(k, raising=False)
            else:
                monkeypatch.setenv(k, v)
        with pytest.raises(SystemExit) as done:
            main(list(args))
        out = capsys.readouterr()
        return done.value.code, out.out, out.err

    return lane


def every_command() -> set[str]:
    """Every leaf command the `lane` app has, as its words (``tail requeue``)."""
    import typer

    found = set()

    def walk(cmd, words):
        subs = getattr(cmd, "commands", None)
        if subs is None:
            found.add(" ".join(words))
            return
        if getattr(cmd, "invoke_without_command", False) and words:  # lanes, tail: a command of their own
            found.add(" ".join(words))
        for name, sub in subs.items():
            walk(sub, [*words, name])

    walk(typer.main.get_command(app), [])
    return found


def a_ledger(url: str, tag: str) -> dict:
    """A ledger with a job of every kind the commands need: waiting, leased, parked (twice), and a spare lane."""
    led = Ledger(url)
    led.set_lane("spare", create=True, allowance=1000)
    led.set_lane("gone", create=True, allowance=1000)
    leased = led.submit(f"{tag}-s", 10, "free")
    led.tick("free")
    parked = [led.submit(f"{tag}-s", 10, "free") for _ in range(2)]
    for job in parked:
        led.park(job, "parked by the test")
    ids = {"leased": leased, "parked": parked[0], "parked2": parked[1], "url": url}
    led.close()
    return ids


def invocations(ids: dict) -> dict[str, list[str]]:
    """One invocation of every command that reads a ledger, against the ledger ``ids`` describe."""
    return {
        "submit": ["submit", "--stage", "s", "--est", "5"],
        "tick": ["tick"],
        "settle": ["settle", f"{ids['leased']}:1", "--actual", "9"],
        "reap": ["reap", "--overdue"],
        "report": ["report"],
        "lanes": ["lanes"],
        "lanes set": ["lanes", "set", "spare", "--ceiling", "500"],
        "lanes delete": ["lanes", "delete", "gone"],
        "lanes clear-drift": ["lanes", "clear-drift", "free"],
        "status": ["status"],
        "tail": ["tail"],
        "tail requeue": ["tail", "requeue", ids["parked"]],
        "tail drop": ["tail", "drop", ids["parked2"]],
        "db upgrade": ["db", "upgrade"],
        "audit": ["audit"],
        "estimators show": ["estimators", "show"],
        "estimators refit": ["estimators", "refit"],
        "simulate": ["simulate", "--lane", "free", "--jobs", "30", "--days", "0.01", "--no-progress"],
        "tenants": ["tenants"],
        "tenants set": ["tenants", "set", "spare", "batch", "--create", "--weight", "2"],
    }


def test_every_command_names_the_ledger_it_reads_first_on_stderr(lane, tmp_path):
    a = a_ledger(f"sqlite:///{tmp_path / 'a.db'}", "a")
    b = a_ledger(f"sqlite:///{tmp_path / 'b.db'}", "b")
    runs_a, runs_b = invocations(a), invocations(b)
    assert set(runs_a) == every_command() - NO_LEDGER, "a command is not in this test: does it name its ledger?"
    for name in sorted(runs_a):
        # ledger a through --db, while the environment names b: each command says a, and works on a
        code, _, err = lane("--db", a["url"], *runs_a[name], env={"LANE_DATABASE_URL": b["url"]})
        first = err.splitlines()[0] if err else ""
        assert first == f"{LEDGER_LINE}sqlite:///{tmp_path / 'a.db'} (from --db)", (name, err)
        assert code == 0, (name, err)
        # ledger b through the environment (another shell): it says b
        code, _, err = lane(*runs_b[name], env={"LANE_DATABASE_URL": b["url"]})
        assert err.splitlines()[0] == f"{LEDGER_LINE}sqlite:///{tmp_path / 'b.db'} (from LANE_DATABASE_URL)", name
        assert code == 0, (name, err)
        assert err.count(LEDGER_LINE) == 1, (name, err)  # one line, once
    # each ledger got its own commands' work: a's parked job was requeued in a, b's in b
    for ids in (a, b):
        led = Ledger(ids["url"])
        assert led.job(ids["parked"])["state"] in ("new", "leased") and led.job(ids["parked2"])["state"] == "failed"
        assert led.lane("spare").ceiling == 500 and led.audit() == []
        led.close()


def test_the_default_ledger_and_a_password_are_named_as_such(lane, tmp_path):
    # the second shell: no LANE_DATABASE_URL, the same lane names, another ledger
    home = tmp_path / "home"
    home.mkdir()
    code, _, err = lane("db", "upgrade", env={"LANE_DATABASE_URL": None, "PREFECT_HOME": str(home)})
    assert code == 0
    assert err.splitlines()[0] == (
        f"{LEDGER_LINE}sqlite:///{home / 'lane.db'} (the default: no --db, LANE_DATABASE_URL unset)"
    )
    code, _, err = lane("--db", "postgresql+psycopg://lane:hunter22@127.0.0.1:1/db", "lanes", env={})
    assert code == 8 and "hunter22" not in err
    assert err.splitlines()[0] == f"{LEDGER_LINE}postgresql+psycopg://lane:***@127.0.0.1:1/db (from --db)", err
    code, out, err = lane("--help", env={})  # reads no ledger: names none
    assert code == 0 and LEDGER_LINE not in err + out


def test_a_shell_sees_the_ledger_line_first_and_stdout_stays_clean(run, env):
    p = run("submit", "--stage", "s", "--est", "5")
    assert p.stderr.startswith(f"{LEDGER_LINE}{env['LANE_DATABASE_URL']} (from LANE_DATABASE_URL)\n"), p.stderr
    assert re.fullmatch(r"[0-9a-f]{32}\n", p.stdout)  # id=$(lane submit ...) still works
    assert json.loads(run("lanes", "--json").stdout)[0]["lane"] == "free"


def test_status_takes_a_lane_name_and_says_did_you_mean_for_neither(run, env):
    led = Ledger(env["LANE_DATABASE_URL"])
    led.set_lane("mylane", create=True, allowance=100_000, max_leased=1)
    first = led.submit("draft", 100, "mylane")
    led.tick("mylane")
    waiting = led.submit("draft", 200, "mylane")
    led.close()
    out = run("status", "mylane").stdout
    assert out.startswith("lane mylane: ok, "), out
    assert "leased 1/1" in out and "first waiting job:" in out and f"job {waiting} (draft, estimate 200)" in out, out
    assert json.loads(run("status", "mylane", "--json").stdout)["lane"] == "mylane"
    assert f"job {first} (draft, estimate 100) is leased in lane mylane" in run("status", first).stdout
    p = run("status", "mylan", check=False)
    assert p.returncode == 3
    assert error_lines(p.stderr) == [
        "lane: error: unknown lane or job 'mylan' (did you mean 'mylane'? lane lanes lists the lanes, lane tail "
        "the parked jobs)"
    ]
    p = run("report", "--lane", "mylan", check=False)  # every unknown lane suggests the closest
    assert p.returncode == 3 and "unknown lane 'mylan' (did you mean 'mylane'? lane lanes lists them)" in p.stderr


def test_a_parked_job_says_why_and_a_lane_with_parked_or_failing_work_is_never_ok(run, env):
    led = Ledger(env["LANE_DATABASE_URL"])
    parked = led.submit("draft", 100, "free")
    led.park(parked, "admission deadline of 30s passed")
    out = " ".join(run("status", parked).stdout.split())  # (wrapped at 100 columns)
    assert out.startswith(
        f"job {parked} (draft, estimate 100) is parked in lane free: admission deadline of 30s passed"
    )
    assert f"lane tail requeue {parked}" in out and f"lane tail drop {parked}" in out
    assert json.loads(run("status", parked, "--json").stdout)["reason"] == "admission deadline of 30s passed"
    assert run("status").stdout.startswith("lane free: attention (1 parked), "), run("status").stdout
    lane_view = " ".join(run("status", "free").stdout.split())
    assert f"job {parked} (draft, estimate 100): admission deadline of 30s passed" in lane_view, lane_view
    run("tail", "drop", parked)
    assert run("status").stdout.startswith("lane free: ok, ")
    failing = led.submit("draft", 100, "free")
    led.tick("free")
    led.settle(failing, 80, outcome="failed")  # its task raised
    led.close()
    out = run("status").stdout
    assert out.startswith("lane free: attention (1 failed attempt in the last hour), "), out
    [free] = [r for r in json.loads(run("status", "--json").stdout) if r["lane"] == "free"]
    assert (free["state"], free["failed_last_hour"]) == ("attention", 1)
    lanes = run("lanes").stdout
    assert re.search(r"^free .* attention: 1 failed in 1h$", lanes, re.M), lanes


def test_requeue_of_a_gated_job_says_to_re_run_its_flow_run_instead(run, env):
    led = Ledger(env["LANE_DATABASE_URL"])
    flow_run = "6b1d8a6e-0f5d-4e0b-9a37-1c2d3e4f5a6b"
    gated = led.submit("critique", 100, "free", key="prefect-task-run:7e0c", run_key=flow_run, waiter="h:1:x")
    led.park(gated, "waiter gone: its wait ended with TimeoutError")
    plain = led.submit("draft", 100, "free")
    led.park(plain, "parked by the test")
    led.close()
    p = run("tail", "requeue", gated, check=False)
    assert p.returncode == 5, p.stderr
    [err] = error_lines(p.stderr)
    said = f"lane: error: job {gated} is a gated job of Prefect task run 7e0c: its task submits it again when its "
    assert err.startswith(said + "flow run is re-run"), err
    assert (
        f"prefect flow-run retry {flow_run}" in err and f"lane tail drop {gated}" in err and "requeued" not in p.stdout
    )
    assert json.loads(run("status", gated, "--json").stdout)["state"] == "parked"  # untouched
    status = run("status", gated).stdout
    assert "a gated job: its task submits it again when its flow run is re-run" in status
    assert f"prefect flow-run retry {flow_run}" in status and "lane tail requeue" not in status.replace(
        "(lane tail requeue cannot)", ""
    )
    assert run("tail", "requeue", plain).stdout.strip() == f"requeued {plain}"  # a job nobody waited for: as before


def test_report_columns_are_explained_in_help_and_docs_and_the_table_fits_100(run, env):
    from lane_plugin.reports.drift import COLUMNS_EXPLAINED, drift

    led = Ledger(env["LANE_DATABASE_URL"])
    for stage, est, actual in (("a-long-stage-name-for-width", 1000, 1600), ("draft", 500, 450)):
        job = led.submit(stage, est, "free", est_version="a-long-estimator-version-v12", rate_cost=est + 2048)
        led.tick("free")
        led.settle(job, actual)
    shown = list(drift(led).columns)
    led.close()
    assert set(shown) - {"stage"} <= set(COLUMNS_EXPLAINED)
    help_text = " ".join(run("report", "--help").stdout.split())
    docs = (ROOT / "docs" / "cli.md").read_text()
    for column, why in COLUMNS_EXPLAINED.items():
        assert f"{column} {why}" in help_text, column
        assert f"| `{column}` | {why} |" in docs, column  # the same words: docs/cli.md's table
    table = run("report").stdout
    assert all(len(line) <= 100 for line in table.splitlines()), table
    assert re.search(r"^a-long-stage-name-for-width .* overspends", table, re.M), table
    assert "more columns with --wide:" in table
    wide = run("report", "--wide").stdout
    header = wide.splitlines()[0].split()
    assert header == shown and " 100%" in wide and "yes" in wide, wide  # under as a percent, rate_cost_set a flag
    by_version = run("report", "--by", "stage,version").stdout
    assert all(len(line) <= 100 for line in by_version.splitlines()), by_version


def test_the_tail_and_lanes_tables_fit_100_columns_and_wide_shows_everything(run, env):
    led = Ledger(env["LANE_DATABASE_URL"])
    led.set_lane("a-lane-with-a-rather-long-name", create=True, allowance=100_000_000)
    reason = "cannot fit in lane 'a-lane-with-a-rather-long-name', which has no period to reset its spend: " * 2
    jobs = [led.submit("a-long-stage-name", 12_345, "a-lane-with-a-rather-long-name") for _ in range(2)]
    for job in jobs:
        led.park(job, reason.strip())
    led.close()
    for args in (["tail"], ["lanes"], ["status"], ["status", "a-lane-with-a-rather-long-name"]):
        out = run(*args).stdout
        assert all(len(line) <= 100 for line in out.splitlines()), (args, out)
    tail = run("tail").stdout.splitlines()
    assert tail[1].split() == ["job", "lane", "stage", "est"], tail  # the columns that fit; the rest named
    assert tail[-1] == "(2 more columns with --wide: parked for, expires in)", tail
    assert tail[2].split()[0] == jobs[0] and tail[3].startswith("  cannot fit in lane"), tail  # the reason below
    wide = run("tail", "--wide").stdout.splitlines()
    assert wide[1].split()[-1] == "reason" and wide[2].endswith(reason.strip()), wide  # one line per job
    assert "overage" in run("lanes", "--wide").stdout.splitlines()[1]


def test_pct_of_ceiling_reads_as_a_percent(run, env):
    led = Ledger(env["LANE_DATABASE_URL"])
    led.set_lane("free", burst_tokens=100_000)
    job = led.submit("s", 82_400, "free")
    led.tick("free")
    led.settle(job, 82_400)
    led.close()
    [free] = [r for r in json.loads(run("status", "--json").stdout) if r["lane"] == "free"]
    assert free["pct_of_ceiling"] == 1.03  # a percent (of 8,000,000), not a fraction
    assert "1.0% of ceiling committed" in run("status").stdout
    assert re.search(r"^free\s.*\s1\.0%\s", run("lanes").stdout, re.M)


def test_a_block_is_named_with_where_it_came_from(monkeypatch):
    from lane_plugin.cli_common import DEFAULT_SOURCE, ledger_source

    monkeypatch.delenv("LANE_DATABASE_URL", raising=False)
    assert ledger_source("block:lane-ledger/prod") == "block lane-ledger/prod, from --db"
    assert ledger_source(None) == DEFAULT_SOURCE
    monkeypatch.setenv("LANE_DATABASE_URL", "lane-ledger/prod")
    assert ledger_source(None) == "block lane-ledger/prod, from LANE_DATABASE_URL"
    assert ledger_source("sqlite:///x.db") == "from --db"
