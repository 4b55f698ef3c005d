"""Two processes on PostgreSQL: after a provider's pause, one probe request for the whole lane (issue 24).

The lane reopens half-way: the first request after a pause goes alone, and every other gate, in every
process, holds until it returns. Each worker process (:mod:`tests.ledger.probe_worker`) runs three gated
blocks at once whose bodies "send" a request of :data:`HOLD` seconds. The test pauses the lane (a 429, as
the gate writes it) while both workers are ready but have not submitted, then lets them go: their jobs wait
out the pause, and once it ends exactly one body starts before the first one's request returns; the others,
of both processes, waited for it. With a probe per process (before), each process sent one (or, the pause
seen by admission only, every lease sent at once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lane_plugin import Ledger

ROOT = Path(__file__).resolve().parents[2]
PAUSE = 3.0  # long beside a loaded machine's start of three gates: each process's jobs wait at its end
HOLD = 0.6  # the probe's request: long beside a gate's read, so a second sender would start inside it
PER_PROCESS = 3
EPS = 0.05  # the workers' clock against the database's (one machine)


@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_after_a_pause_one_probe_goes_for_the_whole_lane_across_two_processes(ledger_url):
    led = Ledger(ledger_url)
    try:
        for lane in ("probe2", "probe2-warm"):
            led.set_lane(lane, allowance=10**9, ceiling=10**9, burst_tokens=10**6, max_leased=100)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        args = [sys.executable, "-m", "tests.ledger.probe_worker", ledger_url, "probe2", str(PER_PROCESS), str(HOLD)]
        workers = [
            subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
            for _ in range(2)
        ]
        try:
            for w in workers:
                assert w.stdout.readline().strip() == "ready", w.stderr.read()
            until = led.pause("probe2", PAUSE, reason="a 429 on job X", job_id=None)
            assert led.lane("probe2").paused_until == until  # the pause happened, before any gate of theirs
            for w in workers:
                w.stdin.write("go\n")
                w.stdin.flush()
            reports = []
            for w in workers:
                out, err = w.communicate(timeout=120)
                assert w.returncode == 0, err
                reports.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
        # every job of both processes was in the ledger, waiting, before the pause ended
        late = led.rows("select count(*) from job where lane = 'probe2' and created_at >= :u", {"u": until})[1][0][0]
        assert late == 0, f"{late} jobs came after the pause ended: the test proves nothing of them"
        sent = sorted((s, e, waited, r["pid"]) for r in reports for s, e, waited in r["sent"])
        assert len(sent) == 2 * PER_PROCESS and {p for *_, p in sent} == {r["pid"] for r in reports}
        early = [round(until - s, 3) for s, *_ in sent if s < until - EPS]
        assert early == [], f"bodies started before the pause ended (s before its end): {early}"
        probe_end = sent[0][1]
        during = [(round(s - sent[0][0], 3), p) for s, _e, _w, p in sent[1:] if s < probe_end]
        assert during == [], f"besides the probe, sent before it returned (s after it, pid): {during}"
        # every other gate, in both processes, was held by the probe (the fault the rule guards against)
        held = {p for _s, _e, waited, p in sent[1:] if waited}
        timeline = [(round(s - until, 3), round(e - until, 3), w, p) for s, e, w, p in sent]
        assert held == {r["pid"] for r in reports}, f"held behind the probe only in {held}: {timeline}"
        assert led.pause_state("probe2") == (0.0, None, None)  # the probe's success reopened the lane
        assert led.audit() == []
    finally:
        led.close()
