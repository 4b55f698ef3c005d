"""Item 8: PostgreSQL restarts twice and every ledger session is killed 10 times during a run of
8 gated workers; they recover by themselves and every acknowledged settlement is in the database.

Restarting the server disrupts everything else using it: this test runs its restarts only in CI
(LANE_REQUIRE_POSTGRES=1, set by .ci/run), in the full run (LANE_FAULT_FULL=1) or with
LANE_FAULT_RESTART=1; otherwise (a developer's `pytest`) it kills sessions only.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from lane_plugin import Ledger

from .conftest import FULL, assert_audit_clean, figure, make_lane, pg_admin, read_json_lines, spawn, wait_all
from .monitor import Monitor

RESTARTS_ALLOWED = FULL or "1" in (os.environ.get("LANE_FAULT_RESTART"), os.environ.get("LANE_REQUIRE_POSTGRES"))


def restart_postgres() -> float:
    # LANE_FAULT_PG_CLUSTER=VERSION/NAME: the cluster LANE_TEST_POSTGRES_URL points at, when it is not
    # the machine's main one (a private cluster keeps the restarts away from everything else)
    cluster = os.environ.get("LANE_FAULT_PG_CLUSTER") or f"{sorted(os.listdir('/etc/postgresql'))[0]}/main"
    version, name = cluster.split("/", 1)
    t = time.monotonic()
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "restart"], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    return time.monotonic() - t


def terminate(app: str) -> int:
    for _ in range(60):
        try:
            admin = pg_admin()
            n = admin.execute(
                "select count(pg_terminate_backend(pid)) from pg_stat_activity where application_name = %s", (app,)
            ).fetchone()[0]
            admin.close()
            return n
        except Exception:
            time.sleep(0.5)
    raise AssertionError("could not reach PostgreSQL to terminate sessions")


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_db_restart_and_killed_sessions(pg_url, tmp_path):
    if not Path("/etc/postgresql").is_dir() and RESTARTS_ALLOWED:
        pytest.skip("no local PostgreSQL cluster to restart (pg_ctlcluster)")
    seconds = 60 if FULL else 24
    restarts = 2 if RESTARTS_ALLOWED else 0
    kills = 10 if FULL else 4
    app = "lanefault_" + pg_url.rsplit("%3D", 1)[1][-12:]
    url = f"{pg_url}&application_name={app}"
    led = Ledger(url, retry_for=180.0)
    make_lane(led, "free", ceiling=10**9)
    outs = [tmp_path / f"gated-{i}.jsonl" for i in range(8)]
    workers = [spawn("gated", url, "free", seconds, out) for out in outs]
    mon = Monitor(url, "free", every=0.1, audit_every=10)
    mon.start()
    # events spread over the run: kills everywhere, the restarts at one and two thirds
    start = time.monotonic()
    events = sorted([(seconds * (i + 0.5) / (kills + 1), "kill") for i in range(kills)]
                    + [(seconds * (i + 1) / (restarts + 1), "restart") for i in range(restarts)])  # fmt: skip
    killed_sessions, restart_times = [], []
    for at, what in events:
        time.sleep(max(0.0, start + at - time.monotonic()))
        if what == "kill":
            killed_sessions.append(terminate(app))
        else:
            restart_times.append(restart_postgres())
    codes = wait_all(workers, timeout=seconds + 300)
    mon.stop()
    assert codes == [0] * 8, codes
    records = [r for out in outs for r in read_json_lines(out)]
    errors = [r["error"] for r in records if "error" in r]
    acked = [r for r in records if "error" not in r]
    assert errors == [], f"{len(errors)} errors reached callers: {errors[:5]}"
    assert mon.violations == [], mon.violations[:5]
    settled = {(j, a): x for j, a, x in led.rows("select job_id, attempt, actual from settlement")[1]}
    missing = [r for r in acked if settled.get((r["job_id"], r["attempt"])) != r["actual"]]
    assert missing == [], f"{len(missing)} acknowledged settlements are not in the database: {missing[:5]}"
    assert len(acked) > 100, f"only {len(acked)} settlements in {seconds}s: the workers did not recover"
    row = led.lane("free")
    assert row.spent == sum(settled.values())
    assert_audit_clean(led)
    figure(f"db restart pg: {seconds}s of 8 gated workers, {len(restart_times)} server restarts "
           f"({', '.join(f'{t:.1f}s' for t in restart_times) or 'skipped: set LANE_FAULT_RESTART=1'}), "
           f"{len(killed_sessions)} rounds of pg_terminate_backend ({sum(killed_sessions)} sessions killed); "
           f"{len(acked)} acknowledged settlements, all {len(acked)} in the database; 0 errors reached a worker; "
           f"{len(acked) - sum(r['replay'] for r in acked)} first results + {sum(r['replay'] for r in acked)} "
           f"replays after a lost commit ack; audit clean")  # fmt: skip
