"""Item 6: a worker SIGKILLs itself inside the settlement transaction, or right after its
commit, and the attempt is retried: exactly one settlement per attempt, spent moves once."""

from __future__ import annotations

import pytest

from lane_plugin import Ledger

from .conftest import assert_audit_clean, figure, make_lane, read_json_lines, reps, spawn, wait_all


@pytest.fixture(params=["sqlite", pytest.param("pg", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    return request.getfixturevalue("pg_url" if request.param == "pg" else "sqlite_url")


@pytest.mark.parametrize("where", ["before_commit", "after_commit"])
def test_crash_in_settlement_then_retry(url, tmp_path, where):
    led = Ledger(url)
    make_lane(led, ceiling=10**6)
    n = reps(5, 50)
    killed = 0
    for rep in range(n):
        job = led.submit("crash", 50, "free")
        [lease] = led.tick("free")
        marker, out = tmp_path / f"marker-{where}-{rep}", tmp_path / f"out-{where}-{rep}.jsonl"
        spent_before = led.lane("free").spent
        env = {"LANE_FAULT": f"settle.{where}", "LANE_FAULT_MARKER": str(marker)}
        [code] = wait_all([spawn("settle_once", url, job, lease.attempt, 40 + rep, out, env=env)], timeout=120)
        assert code == -9, f"rep {rep}: worker exited {code}, expected SIGKILL (-9)"
        assert marker.read_text() == f"settle.{where}"
        assert read_json_lines(out) == [], "the killed worker must never have learned the result"
        killed += 1
        rows = led.rows("select actual from settlement where job_id = :j", {"j": job})[1]
        if where == "before_commit":  # rolled back: nothing billed, the lease is still held
            assert rows == [] and led.job(job)["state"] == "leased"
            assert led.lane("free").spent == spent_before
        else:  # committed: billed once already
            assert rows == [(40 + rep,)] and led.job(job)["state"] == "done"
            assert led.lane("free").spent == spent_before + 40 + rep
        # the retry (a fresh process, as a Prefect retry would be)
        [code] = wait_all([spawn("settle_once", url, job, lease.attempt, 40 + rep, out)], timeout=120)
        assert code == 0
        [result] = read_json_lines(out)
        assert result["replay"] is (where == "after_commit") and result["actual"] == 40 + rep
        assert led.rows("select count(*) from settlement where job_id = :j", {"j": job})[1] == [(1,)]
        assert led.lane("free").spent == spent_before + 40 + rep, "the retry moved spent"
    row = led.lane("free")
    assert row.spent == sum(40 + r for r in range(n)) and row.reserved == 0
    settlements = led.rows("select count(*) from settlement")[1][0][0]
    assert settlements == n
    assert_audit_clean(led)
    figure(
        f"crash {where} {led.db.dialect}: {killed}/{n} workers killed by SIGKILL (exit -9, marker written) "
        f"inside settle.{where}; after retry {settlements} settlements for {n} attempts, "
        f"spent {row.spent} = sum of actuals"
        + ("; every retry returned the first result" if where == "after_commit" else "")
    )
