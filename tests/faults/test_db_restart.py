"""Item 8: PostgreSQL restarts twice and every ledger session is killed 10 times during a run of
8 gated workers; they recover by themselves and every acknowledged settlement is in the database.

Restarting a server disrupts everything else using it (the suite runs on two xdist workers), so the
restarts hit a private cluster this test makes for itself (``pg_createcluster`` on a free port,
dropped afterwards), or the one LANE_FAULT_PG_CLUSTER names. They run only in CI
(LANE_REQUIRE_POSTGRES=1, set by .ci/run), in the full run (LANE_FAULT_FULL=1) or with
LANE_FAULT_RESTART=1; otherwise (a developer's `pytest`) it kills sessions only, on the test server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from lane_plugin import Ledger
from lane_plugin.testing.prefect_server import free_port

from .conftest import FULL, PG_BASE, _libpq_url, assert_audit_clean, figure, make_lane, read_json_lines, spawn, wait_all
from .monitor import Monitor

RESTARTS_ALLOWED = FULL or "1" in (os.environ.get("LANE_FAULT_RESTART"), os.environ.get("LANE_REQUIRE_POSTGRES"))


def restart_postgres(cluster: str) -> float:
    version, name = cluster.split("/", 1)
    t = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "restart"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return time.monotonic() - t


@pytest.fixture
def restart_target(pg_url):
    """``(ledger URL, admin URL, cluster to restart or None)``.

    Restarts allowed: LANE_FAULT_PG_CLUSTER=VERSION/NAME (LANE_TEST_POSTGRES_URL points at it), else a
    private cluster made here on a free port and dropped afterwards. Otherwise the test server (no restart).
    """
    if not RESTARTS_ALLOWED:
        yield pg_url, PG_BASE, None
        return
    if os.environ.get("LANE_FAULT_PG_CLUSTER"):
        yield pg_url, PG_BASE, os.environ["LANE_FAULT_PG_CLUSTER"]
        return
    if not Path("/etc/postgresql").is_dir() or not shutil.which("pg_createcluster"):
        pytest.skip("no local PostgreSQL install to make a private cluster with (pg_createcluster)")
    version = sorted(os.listdir("/etc/postgresql"))[0]
    name, port = f"lane_restart_{os.getpid()}", free_port()
    made = subprocess.run(
        ["pg_createcluster", version, name, "-p", str(port), "--start", "--", "--auth=trust"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, f"pg_createcluster failed: {made.stderr[-2000:]}"
    try:
        subprocess.run(
            [
                "psql",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                "create role root superuser login",
                "-c",
                "create database test owner root",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        url = f"postgresql+psycopg://root@127.0.0.1:{port}/test"
        yield f"{url}?connect_timeout=10", url, f"{version}/{name}"
    finally:
        subprocess.run(["pg_dropcluster", "--stop", version, name], capture_output=True, timeout=120)


def terminate(app: str, admin_url: str) -> int:
    import psycopg

    for _ in range(60):
        try:
            admin = psycopg.connect(_libpq_url(admin_url), autocommit=True, connect_timeout=5)
            n = admin.execute(
                "select count(pg_terminate_backend(pid)) from pg_stat_activity where application_name = %s", (app,)
            ).fetchone()[0]
            admin.close()
            return n
        except Exception:
            time.sleep(0.5)
    raise AssertionError("could not reach PostgreSQL to terminate sessions")


@pytest.mark.pg_processes  # 8 ledger processes on PostgreSQL: one such test at a time
@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_db_restart_and_killed_sessions(restart_target, tmp_path):
    pg_url, admin_url, cluster = restart_target
    seconds = 60 if FULL else 24
    restarts = 2 if RESTARTS_ALLOWED else 0
    kills = 10 if FULL else 4
    app = "lanefault_" + uuid.uuid4().hex[:12]
    url = f"{pg_url}&application_name={app}"
    led = Ledger(url, retry_for=180.0)
    make_lane(led, "free", ceiling=10**9)
    outs = [tmp_path / f"gated-{i}.jsonl" for i in range(8)]
    workers = [spawn("gated", url, "free", seconds, out) for out in outs]
    mon = Monitor(url, "free", every=0.1, audit_every=10)
    mon.start()
    # events spread over the run: kills everywhere, the restarts at one and two thirds
    start = time.monotonic()
    events = sorted(
        [(seconds * (i + 0.5) / (kills + 1), "kill") for i in range(kills)]
        + [(seconds * (i + 1) / (restarts + 1), "restart") for i in range(restarts)]
    )
    killed_sessions, restart_times = [], []
    for at, what in events:
        time.sleep(max(0.0, start + at - time.monotonic()))
        if what == "kill":
            killed_sessions.append(terminate(app, admin_url))
        else:
            restart_times.append(restart_postgres(cluster))
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
    figure(
        f"db restart pg: {seconds}s of 8 gated workers, {len(restart_times)} server restarts "
        f"({', '.join(f'{t:.1f}s' for t in restart_times) or 'skipped: set LANE_FAULT_RESTART=1'}), "
        f"{len(killed_sessions)} rounds of pg_terminate_backend ({sum(killed_sessions)} sessions killed); "
        f"{len(acked)} acknowledged settlements, all {len(acked)} in the database; 0 errors reached a worker; "
        f"{len(acked) - sum(r['replay'] for r in acked)} first results + {sum(r['replay'] for r in acked)} "
        f"replays after a lost commit ack; audit clean"
    )
