"""Issue 10 item 5: a gated job whose waiter is gone is dropped from admission, not leased again and again.

A real process holding 4 leases with 6 more jobs waiting is killed with SIGKILL (and proven dead). The
next run of 10 x 1 s gated jobs in the same lane (lease 3 s, max_leased 4) must not wait behind the dead
run's jobs cycling through attempts: its ideal is the dead leases' expiry (3 s) plus 3 waves of 1 s. The
dead run's jobs end parked with the reason ``waiter gone`` on their first attempt; Prefect's retry (a
higher attempt of the same key) would make the next attempt.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lane_plugin import Ledger

from .conftest import HERE, assert_audit_clean, figure, make_lane

WORKER = HERE / "gated_worker.py"
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request):
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def _spawn(mode: str, url: str, n: int, hold: float, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.Popen([sys.executable, str(WORKER), mode, url, "w", str(n), str(hold), str(out)], env=env)


def _states(led: Ledger, prefix: str) -> dict:
    _, rows = led.rows("select state, count(*) from job where key like :p group by state", {"p": prefix + "%"})
    return {s: n for s, n in rows}


def test_killed_waiters_jobs_are_not_leased_again(url, tmp_path):
    led = Ledger(url)
    make_lane(led, "w", ceiling=10**6, max_leased=4, lease_seconds=3.0, max_attempts=3)
    dead = _spawn("hold", url, 10, 600, tmp_path / "dead.json")
    end = time.monotonic() + 90
    while _states(led, "dead-") != {"leased": 4, "new": 6}:
        assert dead.poll() is None, "the holding process exited early"
        assert time.monotonic() < end, f"never reached 4 leased + 6 waiting: {_states(led, 'dead-')}"
        time.sleep(0.1)
    os.kill(dead.pid, signal.SIGKILL)
    assert dead.wait(timeout=30) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):  # reaped by wait(): the pid names no process any more
        os.kill(dead.pid, 0)

    live = _spawn("run", url, 10, 1.0, tmp_path / "live.json")
    try:
        live.wait(timeout=45)
    except subprocess.TimeoutExpired:
        live.kill()
        live.wait()
        _, rows = led.rows("select key, state, attempt, reason from job where key like 'dead-%' order by key")
        pytest.fail(f"the next run of 10 x 1 s did not finish in 45 s; the dead run's jobs: {rows}")
    result = json.loads((tmp_path / "live.json").read_text())
    assert result["errors"] == []
    figure(
        f"waiter gone ({url.split(':')[0]}): next run of 10 x 1 s on 4 slots after a kill -9 took "
        f"{result['wall']:.1f} s (ideal 6 s: 3 s lease expiry + 3 waves)"
    )
    assert result["wall"] < 15.0
    _, rows = led.rows("select key, state, attempt, lease_attempt, reason from job where key like 'dead-%'")
    assert len(rows) == 10
    for key, state, attempt, lease_attempt, reason in rows:
        assert (state, attempt) == ("parked", 1), (key, state, attempt, reason)
        assert lease_attempt <= 1 and "waiter gone" in reason, (key, lease_attempt, reason)
    assert _states(led, "live-") == {"done": 10}
    assert_audit_clean(led)
