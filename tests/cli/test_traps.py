"""The `lane` CLI without traps (issue 13): what a new user runs into, each as a shell sees it."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import time
from pathlib import Path

import pytest

from ..lane_process import LANE
from .stderr import error_lines


def one_line_error(p, code: int, needle: str) -> None:
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = error_lines(p.stderr)
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def in_a_terminal(args: list[str], env: dict) -> str:
    """Run ``lane`` on a pseudo-terminal (as a person would) and return everything it printed."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.execve(LANE, [LANE, *args], env)
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode(errors="replace")


def test_bare_lane_prints_its_help_once_in_a_terminal_and_piped(run, env):
    shown = in_a_terminal([], env)
    assert shown.count("Usage: lane") == 1, shown
    piped = run()
    assert piped.stdout.count("Usage: lane") == 1 and piped.stderr == ""
    assert in_a_terminal(["db"], env).count("Usage: lane db") == 1


def test_help_shows_switches_without_bool_and_no_literal_backticks(run):
    for cmd in (
        [],
        ["submit"],
        ["tick"],
        ["settle"],
        ["reap"],
        ["report"],
        ["lanes"],
        ["lanes", "set"],
        ["lanes", "delete"],
        ["lanes", "clear-drift"],
        ["status"],
        ["tail"],
        ["tail", "drop"],
        ["audit"],
        ["db", "upgrade"],
        ["simulate"],
    ):
        text = run(*cmd, "--help").stdout
        assert "Usage:" in text
        assert "<bool>" not in text and "`" not in text, (cmd, text)
    assert re.search(r"^\s+--json\s+Print JSON", run("tick", "--help").stdout, re.M)


def test_read_only_commands_on_a_missing_ledger_say_so_exit_3_and_create_nothing(run, tmp_path):
    missing = tmp_path / "nowhere" / "lane.db"
    for cmd in (
        ["lanes"],
        ["status"],
        ["report"],
        ["tail"],
        ["audit"],
        ["lanes", "--json"],
        ["report", "--lane", "free"],
    ):
        p = run("--db", f"sqlite:///{missing}", *cmd, check=False)
        one_line_error(p, 3, f"no ledger at sqlite:///{missing}")
    assert not missing.parent.exists()
    # the default location too: nothing appears beside it
    p = run("lanes", check=False)
    one_line_error(p, 3, "no ledger at")
    assert list(tmp_path.iterdir()) == []


def test_a_write_to_a_missing_directory_or_an_empty_db_is_refused_and_creates_nothing(run, tmp_path, env):
    # `--db sqlite:////typo/dir/x.db db upgrade` made the directory; `--db ""` (an unset shell variable)
    # silently wrote to the default ledger
    missing = tmp_path / "typo" / "dir" / "lane.db"
    for cmd in (["db", "upgrade"], ["submit", "--stage", "s", "--est", "5"]):
        p = run("--db", f"sqlite:///{missing}", *cmd, check=False)
        one_line_error(p, 8, f"no directory {missing.parent}")
    assert not (tmp_path / "typo").exists()
    home = tmp_path / "home"
    for cmd in (["db", "upgrade"], ["submit", "--stage", "s", "--est", "5"], ["lanes"]):
        p = run("--db", "", *cmd, check=False, extra={"PREFECT_HOME": str(home)})
        one_line_error(p, 2, "invalid database URL '': is empty")
    assert not home.exists()
    # a blank LANE_DATABASE_URL (an unset variable in an env file) is refused too, never the default ledger
    p = run("lanes", check=False, extra={"LANE_DATABASE_URL": "  ", "PREFECT_HOME": str(home)})
    one_line_error(p, 2, "LANE_DATABASE_URL ' ': is set but empty (an unset variable in an env file?)")
    assert not home.exists()
    # the default ledger's home is still made on first use: a fresh machine has no ~/.prefect
    unset = {k: v for k, v in env.items() if k != "LANE_DATABASE_URL"}
    p = subprocess.run(
        [LANE, "db", "upgrade"], capture_output=True, text=True, env={**unset, "PREFECT_HOME": str(home)}, timeout=60
    )
    assert p.returncode == 0 and (home / "lane.db").is_file(), p.stderr


def test_a_new_lane_name_with_a_space_is_refused_naming_it(run):
    run("db", "upgrade")
    p = run("lanes", "set", "my lane", "--create", "--allowance", "1000", check=False)
    one_line_error(p, 2, "invalid lane 'my lane': a new lane's name may not contain ' '")
    assert "my lane" not in run("lanes").stdout


def test_db_goes_before_or_after_the_command(run, tmp_path):
    url = f"sqlite:///{tmp_path / 'other.db'}"
    run("--db", url, "db", "upgrade")
    jid = run("submit", "--db", url, "--stage", "s", "--est", "7").stdout.strip()
    assert [x["id"] for x in json.loads(run("tick", "--json", f"--db={url}").stdout)] == [jid]
    assert json.loads(run("lanes", "--json", "--db", url).stdout)[0]["reserved"] == 7
    assert run("lanes", "--json", check=False).returncode == 3  # the default ledger was never made


def test_lanes_set_refuses_an_unknown_lane_without_create_and_delete_removes_an_unused_one(run):
    run("db", "upgrade")
    p = run("lanes", "set", "fre", "--ceiling", "100", check=False)
    one_line_error(p, 3, "unknown lane 'fre' (did you mean 'free'? to create a new lane, add --create)")
    p = run("lanes", "set", "zzz", "--ceiling", "100", check=False)
    one_line_error(p, 3, "unknown lane 'zzz' (a typo? to create a new lane, add --create)")
    assert [x["lane"] for x in json.loads(run("lanes", "--json").stdout)] == ["free", "paid"]
    out = run("lanes", "set", "batch", "--create", "--allowance", "50000").stdout
    assert "lane batch: ceiling 40,000" in out and "lease 1m 30s" in out
    assert run("lanes", "set", "batch", "--burst-tokens", "1000").returncode == 0  # exists now: no --create
    assert "deleted lane batch" in run("lanes", "delete", "batch").stdout
    one_line_error(run("lanes", "delete", "batch", check=False), 3, "unknown lane 'batch'")
    run("submit", "--stage", "s", "--est", "5")
    one_line_error(run("lanes", "delete", "free", check=False), 2, "it has 1 job(s); stop it instead")
    run("lanes", "set", "free", "--fallback", "paid")
    one_line_error(run("lanes", "delete", "paid", check=False), 2, "lane(s) free fall back to it")
    assert [x["lane"] for x in json.loads(run("lanes", "--json").stdout)] == ["free", "paid"]


def test_every_exit_code_in_the_cli_docs(run, tmp_path):
    readme = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()  # README's list moved there
    listed = {
        int(c) for c in re.findall(r"(\d) [a-z]", readme.split("exit codes a shell can use:")[1].split("\n\n")[0])
    }
    assert listed == {1, 2, 3, 4, 5, 6, 7, 8}
    run("db", "upgrade")
    seen = {}
    seen[2] = run("submit", "--stage", "s", "--est", "0", check=False)
    seen[3] = run("report", "--lane", "unknown", check=False)
    seen[4] = run("submit", "--stage", "s", "--est", "50000", check=False)  # burst 40,000
    waiting = run("submit", "--stage", "s", "--est", "10", "--key", "k1").stdout.strip()
    seen[5] = run("tail", "drop", waiting, check=False)  # a job that is not parked
    seen[6] = run("submit", "--stage", "s", "--est", "11", "--key", "k1", check=False)  # same key, other values
    run("lanes", "set", "free", "--stop")
    parked = run("submit", "--stage", "s", "--est", "5", "--wait", "0").stdout.strip()
    time.sleep(0.05)
    run("reap", "--overdue")
    run("lanes", "set", "free", "--resume")
    seen[7] = run("settle", parked, "--actual", "5", check=False)
    seen[8] = run("--db", "postgresql+psycopg://u:pw@127.0.0.1:1/db", "lanes", check=False)
    for code, p in seen.items():
        assert p.returncode == code, (code, p.stderr)
        lines = error_lines(p.stderr)
        assert len(lines) == 1 and lines[0].startswith("lane: error: "), p.stderr
    assert "not parked" in seen[5].stderr and "unknown lane 'unknown'" in seen[3].stderr
    # 1: the audit found a violation
    import sqlite3

    with sqlite3.connect(tmp_path / "cli.db") as conn:
        conn.execute("update lane set reserved = reserved + 999 where name = 'free'")
    p = run("audit", check=False)
    assert p.returncode == 1 and "I2" in p.stdout


def test_durations_in_words_and_iso_utc_in_json(run):
    run("db", "upgrade")
    jid = run("submit", "--stage", "s", "--est", "5", "--wait", "0").stdout.strip()
    time.sleep(0.05)
    run("reap", "--overdue")
    table = run("tail").stdout
    assert re.search(r"expires in", table) and re.search(r"23h 59m", table), table
    [row] = json.loads(run("tail", "--json").stdout)
    assert row["job_id"] == jid
    iso = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z$")
    assert iso.match(row["parked_at"]) and iso.match(row["deadline"]) and "age" not in row
    assert 0 <= row["age_seconds"] < 60
    lease = run("submit", "--stage", "s", "--est", "6").stdout.strip()
    [leased] = json.loads(run("tick", "--json").stdout)
    assert leased["id"] == lease and iso.match(leased["lease_until"])
    status = json.loads(run("status", lease, "--json").stdout)
    assert status["state"] == "leased"
    assert "lane free: attention (1 parked)," in run("status").stdout  # parked work: never "ok"
    run("tail", "drop", jid)
    assert "lane free: ok," in run("status").stdout


def test_no_lock_file_is_left_beside_the_ledger(run, tmp_path):
    run("db", "upgrade")
    run("submit", "--stage", "s", "--est", "5")
    beside = sorted(p.name for p in tmp_path.iterdir())
    assert all(not n.endswith(".lock") for n in beside), beside
    assert set(beside) <= {"cli.db", "cli.db-wal", "cli.db-shm"}


@pytest.mark.usefixtures("prefect_server")
def test_automations_apply_fills_the_block_id_and_says_what_it_created(capsys, monkeypatch):
    from prefect import get_client
    from prefect.blocks.notifications import SlackWebhook

    from lane_plugin import cli

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    block_id = SlackWebhook(url="http://127.0.0.1:9/hook").save("t13-alerts", overwrite=True)

    def lane(*args):
        with pytest.raises(SystemExit) as done:
            cli.main(list(args))
        return done.value.code, capsys.readouterr()

    code, out = lane("automations", "apply", "--block", "slack-webhook/t13-alerts")
    assert code == 0, out.err
    created = out.out.strip().splitlines()
    assert len(created) == 4 and all(line.startswith("created automation '") for line in created)
    assert "'lane crossed its start limit'" in created[0] and "on lane.* -> send-notification" in created[0]
    with get_client(sync_client=True) as client:
        [auto] = client.read_automations_by_name("lane tail above threshold")
    assert str(auto.actions[0].block_document_id) == str(block_id)
    code, out = lane("automations", "apply", "--block", "slack-webhook/t13-alerts")  # again: updated, not doubled
    assert code == 0 and all(line.startswith("updated automation '") for line in out.out.strip().splitlines())
    code, out = lane("automations", "apply", "--block", "slack-webhook/nope")
    assert code == 2 and "no such block" in out.err
    code, out = lane("automations", "apply")
    assert code == 2 and "give a notification block" in out.err


def outlier_lane(env) -> None:
    """Lane d (no period) after one report_usage typo: drift 11.8x, one 108,181 past; 130,000 of 200,000 spent."""
    from lane_plugin import Ledger

    led = Ledger(env["LANE_DATABASE_URL"])
    led.set_lane("d", allowance=200_000, ceiling=200_000, burst_tokens=200_000, max_leased=10)
    for actual in [1_000] * 10 + [120_000]:
        led.submit("s", 1_000, "d")
        [lease] = led.tick("d")
        led.settle(lease, actual)
    led.refit_runs("d")
    led.close()


def test_status_of_a_job_the_drift_allowance_keeps_out_says_why_and_how_much(run, env):
    # 'blocked by drift; 70,000 of 200,000 tokens remaining' for a job of 1,000 reads as a bug: say why.
    outlier_lane(env)
    # The allowance it learned (119,000 for a job of 1,000) is capped at 5% of the ceiling, 10,000: a
    # job of 1,000 fits the 70,000 left; one of 65,000 does not, and says the cap bound.
    jid = run("submit", "--lane", "d", "--stage", "s", "--est", "65000").stdout.strip()
    out = " ".join(run("status", jid).stdout.split())  # (prose wrapped at 100 columns)
    assert "blocked by drift; 70,000 of 200,000 tokens remaining" in out, out
    assert "estimate 65000 plus 10000 tokens of drift allowance" in out and "the next tick parks it" in out, out
    assert "at most 5% of the ceiling (10000)" in out, out


def test_an_operator_clears_a_lanes_drift_allowance_by_name(run, env):
    outlier_lane(env)
    before = next(x for x in json.loads(run("lanes", "--json").stdout) if x["lane"] == "d")
    assert before["drift"] > 11 and before["drift_overrun"] > 100_000
    out = run("lanes", "clear-drift", "d").stdout
    assert "lane d: drift allowance cleared" in out, out
    after = next(x for x in json.loads(run("lanes", "--json").stdout) if x["lane"] == "d")
    assert (after["drift"], after["drift_overrun"], after["drift_spread"]) == (1.0, 0, 0)
    assert run("lanes", "clear-drift", "d").returncode == 0  # idempotent
    one_line_error(run("lanes", "clear-drift", "nope", check=False), 3, "unknown lane 'nope'")
    assert "relearns it only from settlements after" in " ".join(run("lanes", "clear-drift", "--help").stdout.split())


def test_lane_status_says_why_work_waits_when_the_drift_allowance_keeps_it_all_out(run, env):
    # The lane read "ok" while its only waiting job could not be admitted and nothing was leased to settle.
    outlier_lane(env)
    jid = run("submit", "--lane", "d", "--stage", "s", "--est", "65000").stdout.strip()
    shown = run("status").stdout
    line = next(x for x in shown.splitlines() if x.startswith("lane d:"))
    assert line.startswith("lane d: blocked by drift, 65.0% of ceiling committed"), shown
    assert f"\n  job {jid} (s, estimate 65,000) waits in lane d: position 1 of 1" in shown, shown
    assert all(len(x) <= 100 for x in shown.splitlines()), shown
    out = " ".join(shown.split())  # (prose wrapped at 100 columns)
    assert f"job {jid} (s, estimate 65,000) waits in lane d: position 1 of 1, blocked by drift" in out, out
    assert "estimate 65000 plus 10000 tokens of drift allowance" in out and "lane free: ok, " in out, out
    [d] = [r for r in json.loads(run("status", "--json").stdout) if r["lane"] == "d"]
    assert (d["state"], d["blocked_by"], d["head_job"]) == ("blocked by drift", "drift", jid)
    assert "drift allowance" in d["reason"]
    run("lanes", "clear-drift", "d")  # forgotten: the job fits, nothing blocks it, the lane is ok
    [d] = [r for r in json.loads(run("status", "--json").stdout) if r["lane"] == "d"]
    assert (d["state"], d["blocked_by"], d["reason"]) == ("ok", None, None)


def test_the_lanes_table_shows_a_learned_drift_allowance_and_only_then(run, env):
    run("db", "upgrade")
    assert "drift" not in run("lanes").stdout  # nothing learned: the table as it was
    outlier_lane(env)
    out = run("lanes").stdout
    table = out[out.index("drift allowance") :]
    assert all(h in table for h in ("lane", "drift", "overrun", "spread/job", "cap")), out
    [row] = [line for line in table.splitlines() if line.startswith("d ")]
    assert row.split() == ["d", "11.8182x", "108,181", "0", "10,000"], row
    assert "free" not in table and "paid" not in table  # only lanes that learned one
    run("lanes", "clear-drift", "d")
    assert "drift allowance" not in run("lanes").stdout


def test_the_lanes_table_says_a_lane_is_blocked_not_ok(run, env):
    # As lane status does: a rule keeps the first waiting job out and nothing is leased to settle.
    outlier_lane(env)
    run("submit", "--lane", "d", "--stage", "s", "--est", "65000")
    d = next(line for line in run("lanes").stdout.splitlines() if line.startswith("d "))  # the lanes table's row
    assert d.endswith("blocked by drift"), d


def test_status_of_a_leased_job_says_when_its_lease_ends_and_when_it_has_expired_unreaped(run, env):
    # 'is leased' for a lease that ended minutes ago (not yet reaped) sent an operator looking for a live worker.
    run("lanes", "set", "short", "--create", "--allowance", "100000", "--lease-seconds", "6")
    jid = run("submit", "--lane", "short", "--stage", "s", "--est", "10").stdout.strip()
    [lease] = json.loads(run("tick", "--lane", "short", "--json").stdout)
    assert lease["id"] == jid
    out = " ".join(run("status", jid).stdout.split())  # (prose wrapped at 100 columns)
    assert f"job {jid} (s, estimate 10) is leased in lane short (attempt 1), lease ends in" in out, out
    time.sleep(max(0.0, led_left(run, jid)) + 0.2)
    status = json.loads(run("status", jid, "--json").stdout)
    assert status["state"] == "leased" and status["lease_expired"] and status["lease_left"] < 0  # really past, unreaped
    out = " ".join(run("status", jid).stdout.split())
    assert (
        "but its lease expired" in out
        and "the next reap (lane reap, or a waiting gate's periodic check) takes it back" in out
    ), out


def test_a_value_the_command_line_cannot_parse_is_named_in_the_error(run):
    # newer Typer (pydantic) said "Input should be a valid integer" without saying which value it got
    run("db", "upgrade")
    for args, needle in (
        (["submit", "--stage", "s", "--est", "5k"], "'--est' '5k'"),
        (["lanes", "set", "free", "--window-seconds", "1m"], "'--window-seconds' '1m'"),
        (["settle", "x:1", "--actual", "twelve"], "'--actual' 'twelve'"),
    ):
        p = run(*args, check=False)
        one_line_error(p, 2, f"Invalid value for {needle}")


def led_left(run, jid: str) -> float:
    """Seconds left on the job's lease, as `lane status ID --json` says."""
    return json.loads(run("status", jid, "--json").stdout)["lease_left"]


def test_the_lanes_table_fits_the_terminal_or_is_a_block_per_lane_with_no_number_folded(run, env):
    # at 80 columns the boxed table folded 8,000,000 into '8,00' / '0,00' / '0'
    run("db", "upgrade")

    def shown(columns: str, *args: str) -> list[str]:
        out = in_a_terminal(["lanes", *args], {**env, "COLUMNS": columns})
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip() for line in out.splitlines()]
        return [line for line in lines if not line.startswith("lane: ledger ")]  # (stderr: the ledger it read)

    narrow = shown("60")  # narrower than the columns never left out: a block per lane
    assert "  ceiling 8,000,000 · spent 0 · reserved 0" in narrow, narrow
    assert "paid" in narrow and all(len(line) <= 60 for line in narrow), narrow
    at80 = shown("80")  # a table with the columns that fit, the rest named
    assert all(len(line) <= 80 for line in at80) and at80[1].split()[:3] == ["lane", "ceiling", "spent"], at80
    assert any(line.split()[:2] == ["free", "8,000,000"] for line in at80), at80
    assert at80[-1].startswith("(") and "with --wide: " in at80[-1], at80
    wide = shown("200")  # a wide terminal still gets 100 columns; --wide gets them all
    assert all(len(line) <= 100 for line in wide) and wide[1].split()[-1] == "status", wide  # status never lost
    every = shown("200", "--wide")
    heads = ["lane", "ceiling", "spent", "reserved", "remaining", "overage", "%", "ceiling", "leased", "waiting"]
    assert every[1].split() == [*heads, "parked", "limits", "status"], every


def test_a_lease_ending_within_seconds_is_said_to_the_tenth_not_0s():
    from lane_plugin.cli_text import job_lines

    s = {
        "job_id": "j1",
        "stage": "s",
        "est": 10,
        "state": "leased",
        "lane": "q",
        "attempt": 1,
        "lease_left": 0.64,
        "lease_expired": False,
        "gated": False,
    }
    assert job_lines(s) == ["job j1 (s, estimate 10) is leased in lane q (attempt 1), lease ends in 0.6s"]
    assert job_lines({**s, "lease_left": 95.0})[0].endswith("lease ends in 1m 35s")
