"""The fork server the CLI tests run ``lane`` from says what ``lane`` started by a shell says (tests/lane_process.py)."""

from __future__ import annotations

import subprocess

from ..lane_process import LANE, run_lane


def test_a_forked_lane_prints_and_exits_as_an_execd_one(env, tmp_path):
    env = {**env, "LANE_DATABASE_URL": f"sqlite:///{tmp_path / 'same.db'}"}
    cases = [
        ["--help"],
        ["db", "upgrade"],  # creates the ledger: the next ones read it
        ["lanes"],
        ["lanes", "set", "free", "--ceiling", "oops"],  # exit 2, naming the value
        ["status", "no-such-job"],  # exit 3
        ["--db", f"sqlite:///{tmp_path / 'other.db'}", "lanes"],  # the line's ledger, not the env's: missing, exit 3
        ["lanes", "--json"],
    ]
    for args in cases:
        execd = subprocess.run([LANE, *args], capture_output=True, text=True, env=env, timeout=60)
        forked = run_lane(args, env=env)
        assert (forked.returncode, forked.stdout, forked.stderr) == (execd.returncode, execd.stdout, execd.stderr), args
    assert {run_lane(a, env=env).returncode for a in cases[3:6]} == {2, 3}  # not every case exits 0
    # the exit finalizes as an interpreter's does: SQLite's last connection closed, its WAL and SHM files gone
    assert sorted(p.name for p in tmp_path.glob("*.db*")) == ["same.db"]


def test_a_forked_lane_reads_the_environment_it_is_given_not_the_servers(tmp_path):
    first = run_lane(["lanes"], env={"LANE_DATABASE_URL": f"sqlite:///{tmp_path / 'a.db'}", "PATH": "/usr/bin"})
    second = run_lane(["lanes"], env={"LANE_DATABASE_URL": f"sqlite:///{tmp_path / 'b.db'}", "PATH": "/usr/bin"})
    assert "a.db" in first.stderr and "b.db" in second.stderr, (first.stderr, second.stderr)


def test_a_forked_python_c_exits_and_prints_as_an_execd_one():
    """``run_python`` (the import checks of tests/gating/test_exports.py): status, output and the traceback."""
    import sys

    from ..lane_process import run_python

    cases = {
        "import sys; print(sys.argv); sys.exit(3)": (3, "['-c']\n"),
        "import lane_plugin.ledger.db as d; print(d.__name__)": (0, "lane_plugin.ledger.db\n"),
        "raise ValueError('the check failed')": (1, ""),
    }
    for code, (status, stdout) in cases.items():
        execd = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        forked = run_python(code, preload=("prefect.flows",))
        assert (forked.returncode, forked.stdout) == (execd.returncode, execd.stdout) == (status, stdout), code
        assert forked.stderr.splitlines()[-1:] == execd.stderr.splitlines()[-1:], code
    assert "ValueError: the check failed" in forked.stderr
