"""Item 1: the audit finds each kind of corruption from the tables alone, and `lane audit` exits 1
naming it. Plus regressions for ledger bugs found while writing the fault suite."""

from __future__ import annotations

import sqlite3

import pytest
from typer.testing import CliRunner

from lane_plugin import Ledger
from lane_plugin.cli import app

from .conftest import assert_audit_clean, make_lane


def _ledger(tmp_path):
    led = Ledger(f"sqlite:///{tmp_path / 'a.db'}")
    make_lane(led, "free", ceiling=1000)
    done = led.submit("s", 100, "free")
    leased = led.submit("s", 50, "free")
    led.tick("free")
    led.settle(done, 120)
    parked = led.submit("s", 10, "free")
    led.park(parked, "test")
    assert_audit_clean(led)
    return led, dict(done=done, leased=leased, parked=parked)


CORRUPTIONS = {
    "I2 lane free: reserved": "update lane set reserved = reserved + 7 where name = 'free'",
    "I2 lane free: leased counter": "update lane set leased = leased + 1 where name = 'free'",
    "I3 lane free: spent": "update lane set spent = spent - 5 where name = 'free'",
    "I1 lane free: overage": "update lane set overage = overage + 1 where name = 'free'",
    "I1 lane free: admitted": "update lane set ceiling = 100 where name = 'free'",
    "I4 job {done}: attempt 1 is billed but was never leased": "update job set lease_attempt = 0 where id = '{done}'",
    "I5 job {done}: actual": "update job set actual = 1 where id = '{done}'",
    "I5 job {parked}: actual": "update job set actual = 3 where id = '{parked}'",
    "I1 job {done} attempt 1: live settlement": "update settlement set overage = 0 where job_id = '{done}'",
    "I3 job {done} is done but its attempt has no settlement": "update job set attempt = 2 where id = '{done}'",
    "I2 job {leased} is leased": "update job set lease_token = null where id = '{leased}'",
    "I6 parked job {parked}": "delete from tail where job_id = '{parked}'",
    "I6 tail entry {leased}": "insert into tail values ('{leased}', 'free', 's', 50, 'x', 0, 1)",
    "lease of job {leased} held": "update job set lease_until = 1 where id = '{leased}'",
    "lease of job {leased} ends": "update job set lease_until = lease_until + 86400 where id = '{leased}'",
}


@pytest.mark.parametrize("expect", list(CORRUPTIONS))
def test_audit_names_each_corruption(tmp_path, expect):
    led, ids = _ledger(tmp_path)
    con = sqlite3.connect(led.url.path)
    con.execute(CORRUPTIONS[expect].format(**ids))
    con.commit()
    con.close()
    bad = led.audit()
    assert any(line.startswith(expect.format(**ids)) for line in bad), bad
    result = CliRunner().invoke(app, ["--db", str(led.url), "audit"])
    assert result.exit_code == 1 and expect.format(**ids) in result.output


def test_period_rollover_keeps_a_settlement_that_arrives_before_the_next_tick(tmp_path):
    """Regression: a settle after the period boundary, before any tick, was wiped by the tick's reset."""
    t = [86400.0 * 20000 + 3600]
    led = Ledger(f"sqlite:///{tmp_path / 'p.db'}", clock=lambda: t[0])
    make_lane(led, "free", ceiling=1000, period="daily")
    led.submit("s", 100, "free")
    [lease] = led.tick("free")
    t[0] += 86400
    led.settle(lease, 90)
    led.submit("s", 10, "free")
    led.tick("free")
    assert led.lane("free").spent == 90
    assert_audit_clean(led)
