"""``lane estimators show`` and ``lane estimators refit`` as a shell user drives them."""

from __future__ import annotations

import json

from .stderr import error_lines


def test_refit_learns_what_jobs_cost_beyond_their_input_and_show_lists_it(run, tmp_path):
    missing = run("estimators", "show", check=False)
    assert missing.returncode == 3 and "no ledger" in missing.stderr  # read-only: nothing created
    assert run("estimators", "refit", check=False).returncode == 3
    run("db", "upgrade")
    assert "run `lane estimators refit`" in run("estimators", "show").stdout
    assert "nothing to learn from" in run("estimators", "refit").stdout
    for i in range(6):
        jid = run("submit", "--stage", "draft", "--est", "1500", "--est-input", "1000").stdout.strip()
        run("tick")
        run("settle", jid, "--actual", str(1400 + 10 * i))  # outputs 400..450: mean 425
    assert "learned draft: no allowance yet (6 of 20 jobs)" in run("estimators", "refit").stdout
    assert json.loads(run("estimators", "show", "--json").stdout) == []
    out = run("estimators", "refit", "--min-jobs", "5").stdout
    assert "learned draft: allowance 425 (new); 6 jobs" in out and "version #00000000 -> #" in out
    again = json.loads(run("estimators", "refit", "--min-jobs", "5", "--json").stdout)
    assert again["changed"] == {} and again["before"] == again["after"] != "00000000"
    assert again["stages"]["draft"]["allowance"] == 425 and again["stages"]["draft"]["jobs"] == 6
    [row] = json.loads(run("estimators", "show", "--json").stdout)
    assert (row["estimator"], row["stage"], row["allowance"], row["revision"]) == (
        "learned",
        "draft",
        425,
        again["after"],
    )
    table = run("estimators", "show").stdout
    assert "draft" in table and "425" in table and "#" + again["after"] in table
    assert row["fitted_at"].endswith("Z")  # ISO-8601 UTC, like every --json time
    other = f"sqlite:///{tmp_path / 'other.db'}"
    run("--db", other, "db", "upgrade")
    assert "nothing to learn from" in run("estimators", "refit", "--db", other).stdout


def test_bad_options_are_one_line_errors_with_exit_2(run):
    p = run("estimators", "refit", "--window", "0", check=False)
    assert p.returncode == 2 and "window" in p.stderr and len(error_lines(p.stderr)) == 1
    p = run("submit", "--stage", "d", "--est", "10", "--est-input", "-4", check=False)
    assert p.returncode == 2 and "est_input" in p.stderr
