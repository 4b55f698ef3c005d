"""The fork server the CLI tests run ``lane`` from says what ``lane`` started by a shell says (tests/lane_process.py)."""

from __future__ import annotations

import subprocess

from ..lane_process import LANE, run_lane


def test_a_forked_lane_prints_and_exits_as_an_execd_one(env, tmp_path):
    env = {**env, "LANE_DATABASE_URL": f"sqlite:///{tmp_path / 'same.db'}"}
    cases = [
        ["--help"],
        ["lanes"],  # creates the ledger: the next ones read it
        ["lanes", "set", "free", "--ceiling", "oops"],  # exit 2, naming the value
        ["status", "no-such-job"],  # exit 3
        ["--db", f"sqlite:///{tmp_path / 'other.db'}", "lanes"],  # the ledger named on the line, not the env's
        ["lanes", "--json"],
    ]
    for args in cases:
        execd = subprocess.run([LANE, *args], capture_output=True, text=True, env=env, timeout=60)
        forked = run_lane(args, env=env)
        assert (forked.returncode, forked.stdout, forked.stderr) == (execd.returncode, execd.stdout, execd.stderr), args
    assert {run_lane(a, env=env).returncode for a in cases[2:4]} == {2, 3}  # not every case exits 0


def test_a_forked_lane_reads_the_environment_it_is_given_not_the_servers(tmp_path):
    first = run_lane(["lanes"], env={"LANE_DATABASE_URL": f"sqlite:///{tmp_path / 'a.db'}", "PATH": "/usr/bin"})
    second = run_lane(["lanes"], env={"LANE_DATABASE_URL": f"sqlite:///{tmp_path / 'b.db'}", "PATH": "/usr/bin"})
    assert "a.db" in first.stderr and "b.db" in second.stderr, (first.stderr, second.stderr)
