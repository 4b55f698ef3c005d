"""Issue 22 item 3: a hung gated worker stops on SIGTERM within its grace, its leases given back.

A real process (``sigterm_worker.py``) holds 3 leases in gated threads that never leave their bodies (an
hour's sleep, or a lock a thread holds for ever). Each test proves the fault first: the process is alive
and the ledger shows its 3 leases held (3 x 100 reserved). Then SIGTERM: it must be gone within 10 s,
every lease settled ``failed`` at its estimate (``by_estimate``) and the lane's ``reserved`` back to 0.
The control runs the same worker without the handler (``LANE_SIGTERM_GRACE_SECONDS=0``) behind a handler
that unwinds the main thread: still alive after 3 s, its leases still held (the fault the handler fixes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from lane_plugin import Ledger

from .conftest import HERE, assert_audit_clean, figure, make_lane, pg_admin

WORKER = HERE / "sigterm_worker.py"
N, EST = 3, 100
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request):
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def _spawn(stuck: str, previous: str, url: str, grace: str | None = None, **more: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **more}
    env.pop("LANE_SIGTERM_GRACE_SECONDS", None)
    if grace is not None:
        env["LANE_SIGTERM_GRACE_SECONDS"] = grace
    return subprocess.Popen(
        [sys.executable, str(WORKER), stuck, previous, url, "s", str(N)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _held(led: Ledger, proc: subprocess.Popen, key: str = "stuck-%") -> None:
    """Wait until the worker holds its N leases and is stuck in their bodies; fail if it exits."""
    end = time.monotonic() + 90
    while True:
        assert proc.poll() is None, f"the worker exited early ({proc.returncode}): {proc.communicate()}"
        _, rows = led.rows("select count(*) from job where key like :k and state = 'leased'", {"k": key})
        if rows[0][0] == N:
            break
        assert time.monotonic() < end, "the worker never held its leases"
        time.sleep(0.1)
    time.sleep(0.5)  # into the bodies: the lease is picked up before the body runs
    assert proc.poll() is None
    assert led.lane("s").reserved == N * EST


def _given_back(led: Ledger, key: str = "stuck-%") -> None:
    _, jobs = led.rows("select state from job where key like :k", {"k": key})
    assert sorted(s for (s,) in jobs) == ["failed"] * N
    _, rows = led.rows("select actual, by_estimate, outcome from settlement")
    assert sorted((a, bool(b), o) for a, b, o in rows) == [(EST, True, "failed")] * N
    assert led.lane("s").reserved == 0
    assert_audit_clean(led)


def _stop(proc: subprocess.Popen) -> tuple[int, float, str]:
    """SIGTERM; returns the exit code, the seconds it took and stderr (stdout is kept in ``proc.out``)."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.out, err = proc.communicate(timeout=10)  # type: ignore[attr-defined]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # every thread's stack, to stderr
        time.sleep(1.0)
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the worker was still alive 10 s after SIGTERM; its stderr:\n{err[-12000:]}")
    return proc.returncode, time.monotonic() - t0, err


@pytest.mark.parametrize("stuck", ["sleep", "lock"])
def test_sigterm_gives_the_leases_back_then_dies_by_it(url, stuck):
    led = Ledger(url)
    make_lane(led, "s", ceiling=10_000, lease_seconds=30.0)
    proc = _spawn(stuck, "default", url)
    _held(led, proc)
    code, took, err = _stop(proc)
    assert code == -signal.SIGTERM, err[-3000:]  # the default action, handed on once the leases were back
    figure(f"SIGTERM ({url.split(':')[0]}, body stuck in {stuck}): exited in {took:.2f} s, {N} leases given back")
    _given_back(led)


@pytest.mark.parametrize("stuck", ["sleep", "lock"])
def test_sigterm_past_a_handler_that_unwinds_ends_at_the_grace(url, stuck):
    """``sys.exit`` in the process's own handler: Python then waits for the stuck threads at exit, for ever."""
    led = Ledger(url)
    make_lane(led, "s", ceiling=10_000, lease_seconds=30.0)
    grace = 8 if url.startswith("sqlite") and stuck == "sleep" else 3  # the default once, a short one elsewhere
    proc = _spawn(stuck, "exit", url, grace=None if grace == 8 else str(grace))
    _held(led, proc)
    code, took, err = _stop(proc)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert f"did not exit within {grace}s of SIGTERM" in err
    assert grace - 0.5 < took < 10.0
    figure(f"SIGTERM past sys.exit ({url.split(':')[0]}, {stuck}): forced out after {took:.2f} s (grace {grace} s)")
    _given_back(led)


def test_a_handler_that_lives_on_through_sigterm_is_respected(sqlite_url):
    """The process's own handler does nothing: it is not ended at the grace and keeps its leases."""
    led = Ledger(sqlite_url)
    make_lane(led, "s", ceiling=10_000, lease_seconds=30.0)
    proc = _spawn("sleep", "ignore", sqlite_url, grace="2")
    try:
        _held(led, proc)
        proc.send_signal(signal.SIGTERM)
        time.sleep(3.5)
        assert proc.poll() is None, f"ended although its handler chose to live on: {proc.communicate()}"
        _, rows = led.rows("select count(*) from job where key like 'stuck-%' and state = 'leased'")
        assert rows[0][0] == N and led.lane("s").reserved == N * EST
    finally:
        proc.kill()
        proc.communicate()


@contextlib.contextmanager
def _ledger_locked(url: str) -> Iterator[None]:
    """Every ledger write blocks: SQLite's file locked exclusively, or PostgreSQL's job table."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("begin exclusive")
    else:
        schema = url.rsplit("%3D", 1)[1]
        conn = pg_admin()
        conn.autocommit = False
        conn.execute(f"lock table {schema}.job in access exclusive mode")
    try:
        yield
    finally:
        conn.rollback()
        conn.close()


def test_sigterm_with_the_ledger_unreachable_still_exits_in_time(url):
    """The leases cannot be given back (every write blocks): the exit waits half the grace, no more."""
    led = Ledger(url)
    make_lane(led, "s", ceiling=10_000, lease_seconds=30.0)
    proc = _spawn("sleep", "default", url, grace="4")
    _held(led, proc)
    with _ledger_locked(url):
        code, took, err = _stop(proc)
    assert code == -signal.SIGTERM, err[-3000:]
    assert 1.5 < took < 4.0  # it waited for the ledger (2 s, half the grace), then handed the signal on
    figure(f"SIGTERM with the ledger locked ({url.split(':')[0]}): exited in {took:.2f} s (grace 4 s), leases left")
    _, rows = led.rows("select count(*) from job where key like 'stuck-%' and state = 'leased'")
    assert rows[0][0] == N  # left to expire: no longer renewed by anyone


def test_without_the_handler_a_stuck_worker_ignores_sigterm_and_keeps_its_leases(sqlite_url):
    led = Ledger(sqlite_url)
    make_lane(led, "s", ceiling=10_000, lease_seconds=30.0)
    proc = _spawn("sleep", "exit", sqlite_url, grace="0")
    try:
        _held(led, proc)
        proc.send_signal(signal.SIGTERM)
        time.sleep(3.0)
        assert proc.poll() is None, "the fault is gone: the worker exited without the gate's handler"
        _, rows = led.rows("select count(*) from job where key like 'stuck-%' and state = 'leased'")
        assert rows[0][0] == N and led.lane("s").reserved == N * EST
    finally:
        proc.kill()
        proc.communicate()


def test_sigterm_to_a_prefect_flow_run_with_stuck_tasks(url, prefect_server):
    """Prefect's bridge is in front for the run, and its ``TerminationSignal`` unwinds the run through the
    task runner, which joins the stuck task threads for ever: the wakeup fd's watcher sees SIGTERM anyway,
    gives the leases back at once and ends the process at the grace."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    led = Ledger(url)
    make_lane(led, "s", ceiling=10_000, lease_seconds=30.0)
    proc = _spawn(
        "flow", "default", url, grace="3", PREFECT_API_URL=str(PREFECT_API_URL.value()), PREFECT_LOGGING_LEVEL="ERROR"
    )
    _held(led, proc, key="prefect-task-run:%")
    code, took, err = _stop(proc)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert "did not exit within 3s of SIGTERM" in err and 2.5 < took < 10.0
    assert err.count("SIGTERM: gave back the lease") == N  # before the forced exit: stderr is in order
    run_id = next(line.split()[1] for line in proc.out.splitlines() if line.startswith("flow-run "))  # type: ignore[attr-defined]
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run_id).state
    assert state is not None
    figure(
        f"SIGTERM to a Prefect flow run, 3 tasks stuck ({url.split(':')[0]}): leases given back, forced out "
        f"after {took:.2f} s (grace 3 s); the run left {state.type.value} by Prefect's engine"
    )
    _given_back(led, key="prefect-task-run:%")
