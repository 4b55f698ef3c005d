"""Issue 27 item 1: Prefect's timeouts raised into gated threads while they wait for the ledger leave no write
transaction open, no job leased or ``new`` for nobody, and (PostgreSQL) no backend idle in a transaction.

The reproduction, with real Prefect and no patching: sync ``@lane_task(usage=NO_USAGE)`` runs on
``ThreadPoolTaskRunner(max_workers=4)`` in a lane with ``max_leased=1`` (three of four threads wait for admission),
``timeout_seconds`` drawn between 0.02 and 0.4 s, bodies sleeping 0-0.3 s. On SQLite a second PROCESS loops
``BEGIN IMMEDIATE; sleep(0-30 ms); COMMIT`` on the ledger file during the flow and for a second after it, timing
each ``BEGIN IMMEDIATE`` (so the gated threads' own ``BEGIN IMMEDIATE`` waits, where a timeout that fires is raised
right after the lock is won). Before the fix (``Database._txn`` began the transaction outside its ``try``) 88 of 120
runs failed with "cannot start a transaction within a transaction", the outside ``BEGIN IMMEDIATE`` failed after
2 s during and after the flow, and a job was left ``leased`` with nobody running it.

The fault happened first: timeouts fired (runs ``TimedOut`` with ``TaskRunTimeoutError``, counted). Then: no
"within a transaction" anywhere (states, logs); the outside ``BEGIN IMMEDIATE`` never waited 5 s while the flow
ran, nor 1 s after it (``DURING_LIMIT``, ``AFTER_LIMIT``); no job left ``leased`` or ``new``; ``reserved`` back
to 0; audit clean; on PostgreSQL no backend of the ledger idle in a transaction. Runs: the issue's 120 (about 25 s on 2 loaded cores), 360 under ``LANE_FAULT_FULL=1``.

Found by it: a gated thread hung for good on its own Prefect thread shield (one run of 120 in two of two tries):
a timeout's enforcer holds the thread's shield while it raises into the thread, and a thread blocked entering the
shield meanwhile won the shield's inner lock and was interrupted before recording itself as its owner (Prefect's
``ThreadShield`` is a pure-Python ``_RLock``). The gate now enters the shield without blocking inside it
(``lane_plugin.gating.timeouts.enter_shield``); the second test pins that race alone. Seen after it: a gated thread
waiting for ever in ``Thread.start()`` of a new wake-up watcher (a timeout sent to the thread while it started one
reached the new thread: test_spawn.py), and, on PostgreSQL, a timeout surfacing as psycopg's "cannot exit pipeline
mode while busy" (test_pipeline_timeout.py); both fixed, both fail this test again.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
import traceback
import uuid

import pytest
from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from lane_plugin import NO_USAGE, lane_task
from lane_plugin.gating import get_ledger

from .conftest import FULL, assert_audit_clean, figure, make_lane

pytestmark = pytest.mark.timeout(300)

PIPELINE_BUSY = "cannot exit pipeline mode while busy"
RUNS = 360 if FULL else 120
TIMEOUTS = (0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3, 0.4)
NESTED = "within a transaction"
# The outside writer's limits, in seconds, on its waits for the lock. While the flow runs the gate's transactions
# take milliseconds, but a loaded CI machine (2 cores, 4 test workers) once kept one over 1.2 s: a transaction
# left open by an interrupted thread holds the lock until its connection goes, so 5 s tells them apart. After the
# flow nothing of the gate's writes, so any wait there is one.
DURING_LIMIT, AFTER_LIMIT = 5.0, 1.0

# The outside writer: BEGIN IMMEDIATE; sleep(0-30 ms); COMMIT until STOP exists, then one second more. Prints
# its figures as JSON, the waits for the lock while the flow ran and in the second after it apart: how many, the
# longest, the waits over the flow's and the after's limits, errors (its own timeout is 10 s).
OUTSIDE = r"""
import json, os, random, sqlite3, sys, time
path, stop, during_limit, after_limit = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
conn = sqlite3.connect(path, timeout=10, isolation_level=None)
waits, after, errors, end = [], [], [], None
while end is None or time.monotonic() < end:
    if end is None and os.path.exists(stop):
        end = time.monotonic() + 1.0
    t0 = time.monotonic()
    try:
        conn.execute("begin immediate")
    except sqlite3.Error as exc:
        errors.append(f"{time.monotonic() - t0:.2f}s: {exc}")
        continue
    (waits if end is None else after).append(time.monotonic() - t0)
    time.sleep(random.uniform(0, 0.03))
    conn.execute("commit")
    time.sleep(0.005)
print(json.dumps({"n": len(waits), "max": max(waits, default=0), "over": sum(w > during_limit for w in waits),
                  "n_after": len(after), "max_after": max(after, default=0),
                  "over_after": sum(w > after_limit for w in after), "errors": errors}))
"""


def _storm_task(timeout: float):
    @lane_task(stage="storm", estimate=100, usage=NO_USAGE, timeout_seconds=timeout)
    def storm(delay: float):
        time.sleep(delay)
        return delay

    return storm


TASKS = [_storm_task(t) for t in TIMEOUTS]


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        try:
            self.lines.append(f"{record.name}: {record.getMessage()}")
        except Exception:  # noqa: BLE001 - a record that cannot format is not ours to fail on
            pass


def _exc_text(state) -> str:
    try:
        state.result()
    except BaseException as exc:  # noqa: BLE001 - which one is the point
        return f"{type(exc).__name__}: {exc}"
    return ""


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_timeouts_raised_while_waiting_for_the_ledger_leave_nothing_held(db, request, tmp_path, monkeypatch):
    url = request.getfixturevalue("sqlite_url" if db == "sqlite" else "pg_url")
    app = f"lane-storm-{uuid.uuid4().hex[:12]}"
    if db == "postgresql":
        url += f"&application_name={app}"
    monkeypatch.setenv("LANE_DATABASE_URL", url)
    led = get_ledger(url)
    make_lane(led, ceiling=10**9, max_leased=1, lease_seconds=30.0)
    rng = random.Random(27)
    plan = [(rng.choice(TASKS), rng.uniform(0.0, 0.3)) for _ in range(RUNS)]
    logs = _Collect()
    logging.getLogger().addHandler(logs)
    outside = None
    stop = tmp_path / "stop"
    if db == "sqlite":
        outside = subprocess.Popen(
            [sys.executable, "-c", OUTSIDE, led.url.path, str(stop), str(DURING_LIMIT), str(AFTER_LIMIT)],
            stdout=subprocess.PIPE,
            text=True,
        )
    states = []
    engine_crashes = []  # a run whose Prefect task engine itself failed (not a state): its traceback

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=4))
    def storm_flow():
        futures = [task.submit(delay) for task, delay in plan]
        for fut in futures:
            try:
                fut.wait()
            except Exception as exc:  # seen under load: a timeout landing in Prefect's engine before the task began
                engine_crashes.append("".join(traceback.format_exception(exc)))
                continue
            states.append(fut.state)

    t0 = time.monotonic()
    try:
        storm_flow(return_state=True)
    finally:
        took = time.monotonic() - t0
        logging.getLogger().removeHandler(logs)
        stop.touch()
    outside_figs = {}
    if outside is not None:
        out, _ = outside.communicate(timeout=60)
        outside_figs = json.loads(out)
    texts = [_exc_text(s) for s in states]
    timed_out = sum(s.name == "TimedOut" or "TaskRunTimeoutError" in t for s, t in zip(states, texts))
    completed = sum(s.is_completed() for s in states)
    nested = [t for t in texts if NESTED in t] + [line for line in logs.lines if NESTED in line]
    other = sorted({t[:160] for s, t in zip(states, texts) if t and s.name != "TimedOut" and "Timeout" not in t})
    # Seen once in CI before the fix (PostgreSQL): a timeout landing in psycopg's executemany pipeline surfaced as the
    # driver's "cannot exit pipeline mode while busy" (a DatabaseError) instead of the timeout (test_pipeline_timeout.py
    # pins it): a failure again, counted apart in the figure.
    pipeline_busy = sum(PIPELINE_BUSY in t for t in texts)
    _, rows = led.rows("select state, count(*) from job where stage = 'storm' group by state")
    jobs = dict(rows)
    idle_in_txn: list = []
    if db == "postgresql":
        import psycopg

        conninfo = {k: v for k, v in led.url.conninfo.items() if k != "application_name"}
        with psycopg.connect(**conninfo, autocommit=True) as admin:
            for _ in range(5):  # idle in a transaction for over 0.3 s (not between two statements of a live one)
                idle_in_txn = admin.execute(
                    "select pid from pg_stat_activity where application_name = %s and state like 'idle in transaction%%' "
                    "and clock_timestamp() - state_change > interval '0.3 seconds'",
                    (app,),
                ).fetchall()
                if not idle_in_txn:
                    break
                time.sleep(0.2)
    figure(
        f"timeout storm ({db}): {RUNS} runs in {took:.1f}s, {timed_out} timed out, {completed} completed, "
        f"other failures {other[:3]}; 'within a transaction' {len(nested)}; jobs {jobs}; outside BEGIN IMMEDIATE "
        f"{outside_figs.get('n', '-')} taken, max wait {outside_figs.get('max', 0) * 1000:.0f} ms, "
        f"over {DURING_LIMIT:.0f} s {outside_figs.get('over', '-')}; after the flow {outside_figs.get('n_after', '-')} "
        f"taken, max wait {outside_figs.get('max_after', 0) * 1000:.0f} ms; errors {len(outside_figs.get('errors', []))}; "
        f"backends idle in transaction {len(idle_in_txn)}; runs lost in Prefect's engine {len(engine_crashes)}; "
        f"timeouts surfaced as the driver's pipeline error {pipeline_busy}"
    )
    assert len(states) + len(engine_crashes) == RUNS
    # a run Prefect's own engine lost before the task began is no failure of the gate's: none passes through it
    assert not [t for t in engine_crashes if f"lane_plugin{os.sep}" in t], engine_crashes[:1]
    # the fault happened: Prefect's timeouts fired, some while the runs waited for admission or the ledger's lock
    assert timed_out >= RUNS // 10, (timed_out, [s.name for s in states])
    assert nested == [], nested[:5]
    assert pipeline_busy == 0, [t for t in texts if PIPELINE_BUSY in t][:3]
    assert other == [], other
    if outside is not None:
        assert outside_figs["errors"] == [] and outside_figs["over"] == 0, outside_figs
        assert outside_figs["n_after"] > 10 and outside_figs["over_after"] == 0, outside_figs
        assert outside_figs["n"] > 10, outside_figs  # it really contended during the flow
    assert jobs.get("leased", 0) == 0 and jobs.get("new", 0) == 0, jobs
    lane = led.lane("free")
    assert (lane.reserved, lane.leased) == (0, 0)
    assert idle_in_txn == []
    assert_audit_clean(led)


def _shield_race(enter) -> tuple[bool, bool]:
    """A thread blocked entering its shield (``enter()``) while an enforcer, holding that shield, raises Prefect's
    CancelledError into it, then lets go (as ``WatcherThreadCancelScope._send_cancelled_error`` does): (the
    exception reached the thread, the shield was left locked with nobody inside)."""
    from prefect._internal.concurrency.cancellation import CancelledError, _get_thread_shield, _send_exception_to_thread

    raised, go = [], threading.Event()

    def victim():
        go.wait(5)
        try:
            with enter():
                pass
            for _ in range(50):  # (a pending exception not yet raised lands here)
                time.sleep(0.01)
        except CancelledError:
            raised.append(True)

    thread = threading.Thread(target=victim, name="shield-victim")
    thread.start()
    shield = _get_thread_shield(thread)
    with shield:  # the enforcer's hold
        go.set()
        time.sleep(0.2)  # the victim now waits on the shield
        _send_exception_to_thread(thread, CancelledError)
    thread.join(5)
    assert not thread.is_alive()
    block = shield._lock._block
    leaked = not block.acquire(timeout=1.0)
    block.release()  # (left locked: freed here for the rest of the session)
    return bool(raised), leaked


def test_a_timeout_raised_while_the_thread_waits_for_its_shield_leaves_the_shield_free():
    from prefect._internal.concurrency.cancellation import shield as prefects_shield

    from lane_plugin.gating import timeouts

    prefect_raised, prefect_leaked = _shield_race(prefects_shield)
    raised, leaked = _shield_race(timeouts.shield)
    figure(
        f"shield race: Prefect's shield() raised {prefect_raised}, left locked {prefect_leaked}; the gate's "
        f"timeouts.shield() raised {raised}, left locked {leaked}"
    )
    assert raised, "the exception never reached the thread: the race was not run"  # the fault happened
    assert not leaked, "the thread's shield was left locked: its next gated call (and every enforcer) would hang"
