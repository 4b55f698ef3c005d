"""Two park_overdue passes at once (two processes) park each overdue job exactly once."""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

import pytest

from lane_plugin import Ledger

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_park import _pass, check, make_overdue  # noqa: E402


@pytest.mark.parametrize("n", [3000])
def test_two_concurrent_passes_park_each_job_once(ledger_url, n):
    led = Ledger(ledger_url)
    led.upgrade()
    ids = make_overdue(led, n)
    waiting = led.submit("draft", 100, wait_seconds=3600)  # not overdue: stays put
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_pass, args=(ledger_url, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert "parked exactly once" in check(led, ids, [lst for _, lst in results])
    assert led.job(waiting)["state"] == "new"
    assert led.lanes()[0]["parked"] + led.lanes()[1]["parked"] == n
    led.close()
