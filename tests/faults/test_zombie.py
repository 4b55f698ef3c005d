"""Item 7: a holder is SIGSTOPped past its lease, reaped, the job runs again elsewhere, and the
zombie resumes and settles late: both attempts billed once, the late one marked, no overspend."""

from __future__ import annotations

import os
import signal
import time

import pytest

from lane_plugin import Ledger

from .conftest import assert_audit_clean, figure, make_lane, read_json_lines, reps, spawn, wait_all
from .monitor import Monitor


def _wait_line(path, pred, proc, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for rec in read_json_lines(path):
            if pred(rec):
                return rec
        assert proc.poll() is None, f"worker exited {proc.returncode}"
        time.sleep(0.005)
    raise AssertionError(f"no line in {path}")


@pytest.mark.postgres
@pytest.mark.slow
def test_zombie_worker(pg_url, tmp_path):
    led = Ledger(pg_url)
    n = reps(3, 20)
    late_billed = 0
    max_committed = 0
    for rep in range(n):
        lane = f"z{rep}"
        make_lane(led, lane, ceiling=150, lease_seconds=1.0)
        mon = Monitor(pg_url, lane, every=0.01, audit_every=10)
        mon.start()
        job = led.submit("zombie", 100, lane)
        z_out, r_out = tmp_path / f"z-{rep}.jsonl", tmp_path / f"r-{rep}.jsonl"
        zombie = spawn("hold", pg_url, job, 70, z_out, 5.0)
        try:
            leased = _wait_line(z_out, lambda r: r.get("event") == "leased", zombie)
            os.kill(zombie.pid, signal.SIGSTOP)
            while led.now() <= leased["lease_until"]:
                time.sleep(0.05)
            assert led.job(job)["state"] == "leased"  # expired, not yet reaped
            moved = led.reap()
            assert job in moved.requeued
            assert led.job(job)["attempt"] == 2
            rerun = spawn("hold", pg_url, job, 90, r_out, 0.0)
            assert wait_all([rerun], timeout=120) == [0]
            [_, second] = read_json_lines(r_out)
            assert second == {"event": "settled", "attempt": 2, "late": False, "replay": False, "actual": 90}
            filler = led.submit("filler", 61, lane)
            assert led.tick(lane) == []  # the filler does not fit: 90 spent + 61 > 150 (parked: no period)
        finally:
            os.kill(zombie.pid, signal.SIGCONT)
        assert wait_all([zombie], timeout=120) == [0]
        late = [r for r in read_json_lines(z_out) if r.get("event") == "settled"]
        assert late == [{"event": "settled", "attempt": 1, "late": True, "replay": False, "actual": 70}]
        mon.stop()
        rows = led.rows("select attempt, actual, late from settlement where job_id = :j order by attempt", {"j": job})[
            1
        ]
        assert [(a, x, bool(lt)) for a, x, lt in rows] == [(1, 70, True), (2, 90, False)]
        row = led.lane(lane)
        assert row.spent == 160 and row.overage == 70 and row.reserved == 0
        assert led.job(job)["actual"] == 160 and led.job(filler)["state"] == "parked"
        assert mon.violations == [] and mon.errors == [], (mon.violations[:5], mon.errors[:5])
        max_committed = max(max_committed, mon.max_committed)
        late_billed += 1
    assert_audit_clean(led)
    figure(
        f"zombie pg: {late_billed}/{n} SIGSTOPped holders reaped, re-run elsewhere and settled late on SIGCONT; "
        f"each attempt billed exactly once (late one marked late, overage 70); max sampled committed "
        f"{max_committed} <= ceiling 150"
    )
