"""Item 10: many machines, simulated. Four OS processes each run a Prefect flow of @lane_task tasks
against one PostgreSQL ledger (one Prefect test server); total demand is 3x the lane."""

from __future__ import annotations

import pytest

from lane_plugin import Ledger

from .conftest import assert_audit_clean, figure, make_lane, read_json_lines, reps, spawn, wait_all
from .monitor import Monitor


@pytest.mark.pg_processes  # 4 Prefect flow processes on one PostgreSQL ledger: one such test at a time
@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_four_machines_one_ledger(pg_url, tmp_path):
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    machines, per_machine, est, ceiling = 4, 15, 100, 2000  # demand 4 x 15 x 100 = 3 x ceiling
    runs = reps(1, 3)
    totals = {"done": 0, "JobParked": 0, "other": 0}
    max_committed = 0
    with prefect_test_harness(server_startup_timeout=90):
        api = PREFECT_API_URL.value()
        for run in range(runs):
            led = Ledger(pg_url)
            lane = f"m{run}"
            make_lane(led, lane, ceiling=ceiling, max_leased=25, burst_tokens=10**6, lease_seconds=30.0)
            mon = Monitor(pg_url, lane, every=0.05, audit_every=10)
            mon.start()
            outs = [tmp_path / f"machine-{run}-{i}.jsonl" for i in range(machines)]
            env = {"PREFECT_API_URL": api, "PREFECT_LOGGING_LEVEL": "ERROR"}
            procs = [spawn("prefect_flow", pg_url, lane, per_machine, est, o, env=env) for o in outs]
            codes = wait_all(procs, timeout=600)
            mon.stop()
            assert codes == [0] * machines, codes
            results = [r for o in outs for r in read_json_lines(o)]
            assert len(results) == machines * per_machine
            unclear = [r for r in results if r["outcome"] not in ("done", "JobParked")]
            assert unclear == [], f"tasks ended without a clear outcome: {unclear[:3]}"
            row = led.lane(lane)
            assert row.spent - row.overage + row.reserved <= ceiling and row.reserved == 0
            assert mon.violations == [] and mon.errors == [], (mon.violations[:3], mon.errors[:3])
            cols, jobs = led.rows("select state, reason from job where lane = :l", {"l": lane})
            for state, reason in jobs:
                assert state in ("done", "parked", "failed"), state
                assert state == "done" or reason, f"a {state} job without a reason"
            done = sum(r["outcome"] == "done" for r in results)
            assert done == sum(s == "done" for s, _ in jobs)
            assert row.spent == sum(r["actual"] for r in results if r["outcome"] == "done")
            assert_audit_clean(led)
            totals["done"] += done
            totals["JobParked"] += sum(r["outcome"] == "JobParked" for r in results)
            max_committed = max(max_committed, mon.max_committed)
            led.close()
    figure(
        f"prefect machines pg: {runs} run(s) of {machines} processes x {per_machine} @lane_task tasks "
        f"(demand 3x the ceiling {ceiling}): {totals['done']} done, {totals['JobParked']} parked with a reason "
        f"(JobParked), 0 unclear; max sampled committed {max_committed} <= {ceiling}; audit clean"
    )
