"""Two processes on PostgreSQL: a 429 met in one stops the other from sending (issue 24).

Process B runs gated blocks (:func:`lane_plugin.gate`: admission, the pause check before the body, the
body, the settlement) again and again, each body noting when it would send. This process meets the
provider's 429 and pauses the lane (what the gate does, :meth:`Ledger.pause`). The test proves the pause
happened while B was sending (B's grants before it, the pause row committed), then that no body of B began
(sent) from one transaction's time after the pause until it ended, nor was B granted a lease then, and that
B resumed once it did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lane_plugin import Ledger

ROOT = Path(__file__).resolve().parents[2]
PAUSE = 2.0
ONE_TRANSACTION = 0.25  # a grant whose transaction held the lane lock as the pause began may commit after it


@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_a_429_in_one_process_stops_the_other_from_sending(ledger_url, tmp_path):
    led = Ledger(ledger_url)
    led.set_lane("two", allowance=10**9, ceiling=10**9, burst_tokens=10**6, max_leased=4)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stop = tmp_path / "stop"
    b = subprocess.Popen(
        [sys.executable, "-m", "tests.ledger.pause_worker", ledger_url, "two", str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while led.rows("select count(*) from job where lane = 'two' and admitted_at is not null")[1][0][0] < 5:
            assert time.monotonic() < deadline and b.poll() is None, "process B never got going"
            time.sleep(0.05)
        until = led.pause("two", PAUSE, reason="a 429 on job X in process A", job_id=None)
        paused_at = until - PAUSE
        # the pause happened, while B was sending
        assert led.lane("two").paused_until == until
        before = led.rows("select count(*) from job where lane = 'two' and admitted_at < :p", {"p": paused_at})[1][0][0]
        assert before >= 5
        # B runs until told: once it has been granted a lease after the pause ended (or 60 s)
        deadline = time.monotonic() + 60
        while led.rows("select count(*) from job where lane = 'two' and admitted_at >= :u", {"u": until})[1][0][0] < 3:
            assert time.monotonic() < deadline and b.poll() is None, "process B never resumed after the pause"
            time.sleep(0.05)
        stop.touch()
        out, err = b.communicate(timeout=120)
    finally:
        if b.poll() is None:
            b.kill()
    assert b.returncode == 0, err
    grants = [
        r[0]
        for r in led.rows(
            "select admitted_at from job where lane = 'two' and admitted_at is not null order by admitted_at"
        )[1]
    ]
    during = [g for g in grants if paused_at + ONE_TRANSACTION <= g < until]
    assert during == [], f"B was granted {len(during)} leases while the lane was paused"
    report = json.loads(out.strip().splitlines()[-1])
    sent = report["sent"]
    assert [t for t in sent if t < paused_at], "B sent nothing before the pause"
    into = [round(t - paused_at, 3) for t in sent if paused_at + ONE_TRANSACTION <= t < until]
    assert into == [], f"B sent into the closed window (s after the pause): {into}"
    assert [t for t in sent if t >= until], "B never sent again after the pause"
    assert report["ran"] == len(grants)
    assert led.audit() == []
