"""Ctrl-C during a gated LLM call, in a process of its own, on each database.

Prefect runs a sync task called from a flow in the main thread, where SIGINT is raised as
``KeyboardInterrupt``: it cuts the call short like a timeout does, and the provider may bill the call, so the
gate bills at least the estimate (``by_estimate``), never just the 100 tokens reported before. The worker
(``ctrlc_worker.py``) is a real process sent a real SIGINT, as a terminal sends it; a crash of that process
(not an exception) is told apart by its exit code and the stacks ``faulthandler`` prints. Run inside a test
worker (tests/gating/test_lifecycle_hostile.py once did) the PostgreSQL case killed pytest-xdist's worker
twice with no stack, so that case lives here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from lane_plugin import Ledger

from .conftest import HERE, assert_audit_clean, figure, make_lane

WORKER = HERE / "ctrlc_worker.py"
EST, REPORTED = 500, 100
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request):
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def test_ctrl_c_during_the_call_bills_the_estimate_and_leaves_nothing_held(url, prefect_server):
    from prefect.settings import PREFECT_API_URL

    led = Ledger(url)
    make_lane(led, "c", ceiling=10_000, lease_seconds=30.0)
    env = {
        **os.environ,
        "PYTHONPATH": str(HERE.parents[1]),
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "ERROR",
    }
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), url, "c"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()  # blocks until the body runs (or the worker ends)
        assert line.strip() == "in-call", f"the worker never reached its call: {line!r} {proc.communicate()}"
        _, rows = led.rows("select state from job where stage = 'ctrl-c'")
        assert rows == [("leased",)], rows  # the fault's setting: the call holds its lease
        time.sleep(0.3)  # into the sleep
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    took = time.monotonic() - sent
    assert proc.returncode == 0 and "interrupted KeyboardInterrupt" in out, (proc.returncode, out, err[-6000:])
    assert took < 25, f"the interrupt did not cut the 30 s call short ({took:.1f} s)"  # the fault happened
    _, jobs = led.rows("select state from job where stage = 'ctrl-c'")
    _, sets = led.rows("select actual, by_estimate, outcome from settlement")
    assert jobs == [("failed",)], jobs
    assert [(a, bool(b), o) for a, b, o in sets] == [(EST, True, "failed")], sets
    lane = led.lane("c")
    assert (lane.reserved, lane.leased, lane.spent) == (0, 0, EST)
    assert_audit_clean(led)
    figure(
        f"Ctrl-C in a gated call ({url.split(':')[0]}): the process left the flow {took:.2f} s after SIGINT, "
        f"billed {EST} by its estimate ({REPORTED} reported before)"
    )
