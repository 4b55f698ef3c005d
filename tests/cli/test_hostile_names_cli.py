"""Hostile bytes and a typo'd lane, as a shell sees them: a one-line error, nothing created (an outside review)."""

from __future__ import annotations

import pytest

from .stderr import error_lines


@pytest.fixture
def run(run):
    run("db", "upgrade")
    return run


def one_line_error(p, code: int, needle: str) -> None:
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = error_lines(p.stderr)
    assert len(lines) == 1 and needle in lines[0], p.stderr


# a non-UTF-8 byte on the command line (b'\xff') arrives in sys.argv as the lone surrogate '\udcff'
@pytest.mark.parametrize(
    "args", [("estimators", "show", "--estimator", "\udcff"), ("estimators", "refit", "--estimator", "\udcff")]
)
def test_an_estimator_name_that_is_not_text_is_bad_input(run, args):
    one_line_error(run(*args, check=False), 2, "invalid estimator")


def test_a_ledger_url_that_is_not_text_is_bad_input_and_creates_nothing(run, tmp_path):
    p = run("lanes", "--db", f"sqlite:///{tmp_path}/\udcff.db", check=False)
    one_line_error(p, 2, "invalid database URL")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cli.db"]


def test_refit_of_an_unknown_lane_says_so_not_nothing_to_learn(run):
    # `lane estimators refit --lane typo` said 'nothing to learn from ...: no done job recorded its input
    # tokens', exit 0; `lane report --lane typo` says the lane is unknown, exit 3
    one_line_error(run("report", "--lane", "typo", check=False), 3, "unknown lane 'typo'")
    one_line_error(run("estimators", "refit", "--lane", "typo", check=False), 3, "unknown lane 'typo'")
