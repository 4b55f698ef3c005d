"""The ``lane`` command as a shell runs it: a process of its own on a ledger of its own (``LANE_DATABASE_URL``)."""

from __future__ import annotations

import os

import pytest

from ..lane_process import run_lane


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "LANE_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}", "COLUMNS": "200"}


@pytest.fixture
def run(env):
    """``run(*args, check=True, extra=None)``: the finished process; ``check`` asserts exit 0, ``extra`` adds env."""

    def run(*args, check=True, extra=None):
        p = run_lane(list(args), env={**env, **(extra or {})}, timeout=60)
        if check:
            assert p.returncode == 0, p.stderr
        return p

    return run
