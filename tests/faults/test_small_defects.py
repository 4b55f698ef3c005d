"""Issue 10 item 10: the smaller defects the outside fault hunt found, each on both databases.

- a shadow version of 129-200 characters failed only on PostgreSQL (its column holds 128);
- ``lanes set L --allowance 1000`` was refused with "invalid ceiling 8000000" (a field not given);
- ``audit --grace nan`` was accepted;
- ``Ledger.rows()``, documented read-only, ran ``delete`` on SQLite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lane_plugin import InvalidInput, Ledger

from .conftest import assert_audit_clean, counts, figure


def _lane(*args):
    exe = Path(sys.executable).with_name("lane")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "lane_plugin.cli"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120, env={**os.environ})


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request):
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def test_a_long_shadow_version_is_refused_alike_on_both_databases(url):
    led = Ledger(url)
    ok = led.submit("s", 10, shadows={"v" * 128: 12})
    assert led.rows("select version from shadow_estimate where job_id = :j", {"j": ok})[1] == [("v" * 128,)]
    before = counts(led)
    with pytest.raises(InvalidInput, match=r"invalid shadow version 'vvv.*longer than 128 characters \(150\)"):
        led.submit("s", 10, shadows={"v" * 150: 12})
    assert counts(led) == before
    assert_audit_clean(led)


def test_changing_the_allowance_moves_a_default_ceiling_and_names_the_allowance_otherwise(url):
    led = Ledger(url)
    assert led.set_lane("new", allowance=1000).ceiling == 800  # a new lane: 80% of its allowance
    assert led.set_lane("free", allowance=1000).ceiling == 800  # the default lane's default ceiling follows
    led.set_lane("mine", allowance=5000, ceiling=4200)
    assert led.set_lane("mine", allowance=4500).ceiling == 4200  # a chosen ceiling stays
    with pytest.raises(InvalidInput, match=r"invalid allowance 1000: below the lane's ceiling 4200"):
        led.set_lane("mine", allowance=1000)
    assert led.lane("mine").allowance == 4500
    assert_audit_clean(led)


def test_audit_refuses_a_grace_that_is_not_a_number(url):
    led = Ledger(url)
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(InvalidInput, match="invalid grace"):
            led.audit(grace=bad)


def test_rows_cannot_write(url):
    led = Ledger(url)
    for _ in range(3):
        led.submit("s", 10)
    before = counts(led)
    refused = 0
    for sql in (
        "delete from job",
        "update lane set spent = 999",
        "insert into tail (job_id, lane, stage, est, "
        "reason, parked_at, deadline) values ('x', 'free', 's', 1, 'r', 0, 0)",
        "drop table job",
    ):
        with pytest.raises(InvalidInput, match="read-only"):
            led.rows(sql)
        refused += 1
    assert counts(led) == before and led.lane("free").spent == 0
    assert led.rows("select count(*) from job")[1] == [(3,)]  # reading still works, and writing after it:
    led.submit("s", 10)
    assert counts(led)["job"] == 4
    figure(f"rows read-only {led.db.dialect}: {refused} of 4 writing statements refused, tables unchanged")
    assert_audit_clean(led)


def test_the_cli_names_the_field_and_the_value(tmp_path):
    db = f"sqlite:///{tmp_path / 'l.db'}"
    nan = _lane("--db", db, "audit", "--grace", "nan")
    assert nan.returncode == 2 and "invalid grace nan" in nan.stderr, nan.stderr
    new = _lane("--db", db, "lanes", "set", "fresh", "--create", "--allowance", "1000", "--json")
    assert new.returncode == 0 and '"ceiling": 800' in new.stdout, new.stderr
    free = _lane("--db", db, "lanes", "set", "free", "--allowance", "1000")
    assert free.returncode == 0 and "ceiling 800" in free.stdout, free.stderr
    paid = _lane("--db", db, "lanes", "set", "paid", "--allowance", "1000")  # its ceiling is its allowance
    assert paid.returncode == 2 and "invalid allowance 1000: below the lane's ceiling 100000000" in paid.stderr
    figure(
        "small defects cli: audit --grace nan exit 2; lanes set free --allowance 1000 -> ceiling 800 (was: "
        "'invalid ceiling 8000000'); paid --allowance 1000 -> exit 2 naming the allowance"
    )
