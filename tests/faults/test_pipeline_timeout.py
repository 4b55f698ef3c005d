"""A timeout raised into a thread inside psycopg's pipeline (``executemany``) surfaces as the timeout, and the
connection is discarded, never reused.

psycopg runs ``executemany`` in pipeline mode. An exception raised asynchronously into the thread (Prefect's
timeout) while the pipeline syncs at its exit leaves results unread; the pipeline's ``finally`` then fails to leave
pipeline mode and raises "cannot exit pipeline mode while busy" in place of the timeout (seen in the timeout storm on
PostgreSQL, then reported as a ``DatabaseError`` instead of a ``TimedOut`` run). Here an exception is raised before
every bytecode psycopg's pipeline code runs for one ``executemany`` in a transaction: first on a bare psycopg
connection (the fault: some points surface as the driver's error), then through the ledger's transaction, where
each must surface as the exception raised, the pool keep all its slots, no backend stay idle in a transaction, and
the next transaction run. About 770 bytecodes: by default about 60 points and those where psycopg alone failed (some
15 s); ``LANE_FAULT_FULL=1`` every one (about 150 s).
"""

from __future__ import annotations

import gc
import sqlite3
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from lane_plugin.errors import DatabaseError
from lane_plugin.ledger import Ledger
from lane_plugin.ledger.db import PG_POOL

from .conftest import FULL, figure, make_lane
from .injection import Injected, Injector, in_files, run_injected

pytestmark = pytest.mark.timeout(300)

PIPELINE_FILES = tuple(str(Path(psycopg.__file__).parent / name) for name in ("_pipeline.py", "_pipeline_base.py"))
ROWS = [{"a": i} for i in range(5)]
POINTS = 60  # injection points through the ledger by default (of about 770 bytecodes; all under LANE_FAULT_FULL=1)


def _injected(call, at: int) -> tuple[str, int, str | None]:
    """Run ``call()`` with :class:`Injected` raised before the ``at``-th pipeline bytecode: (what it raised, bytecodes
    seen, where it was set)."""
    inj = Injector(at, in_files(*PIPELINE_FILES), opcodes=True, where="function")
    outcome = run_injected(call, inj, errors=True)  # which error a call ends in is the point
    outcome = "Injected" if outcome == "raised" else outcome
    return outcome, inj.seen, inj.fired_at


def _idle_in_transaction(conninfo: dict, app: str) -> list:
    """The application's backends idle in a transaction for over 0.3 s (a closed connection's backend may show for a
    moment after the close), looked at for 1.5 s."""
    with psycopg.connect(**conninfo, autocommit=True) as admin:
        for _ in range(6):
            rows = admin.execute(
                "select pid, state from pg_stat_activity where application_name = %s and state like "
                "'idle in transaction%%' and clock_timestamp() - state_change > interval '0.3 seconds'",
                (app,),
            ).fetchall()
            if not rows:
                return []
            time.sleep(0.25)
    return rows


def test_a_timeout_inside_psycopgs_pipeline_is_what_the_transaction_raises(request):
    url = request.getfixturevalue("pg_url")
    app = f"lane-pipe-{uuid.uuid4().hex[:12]}"
    led = Ledger(url + f"&application_name={app}")
    make_lane(led)
    conninfo = {k: v for k, v in led.url.conninfo.items() if k != "application_name"}
    worker = ThreadPoolExecutor(1, thread_name_prefix="gated-worker")

    def bare():  # psycopg alone: a transaction whose executemany runs in a pipeline
        with psycopg.connect(**conninfo) as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany("select %(a)s", ROWS)

    def ledger():
        led.db.transaction(lambda cur: cur.executemany("select :a", ROWS), write=False)

    try:
        outcome, total, _ = worker.submit(_injected, ledger, 10**9).result(30)
        assert outcome == "returned" and total > 20, (outcome, total)
        # the fault: psycopg alone turns some of these interruptions into its own error (every point under
        # LANE_FAULT_FULL=1; else until the first few)
        driver: dict[str, int] = {}
        for at in range(1, total + 1):
            outcome, _, fired_at = worker.submit(_injected, bare, at).result(30)
            if "pipeline mode" in outcome:
                driver[f"{fired_at}"] = at
                if len(driver) >= 3 and not FULL:
                    break
        # through the ledger: the interruption is what is raised, the connection never reused (every point under
        # LANE_FAULT_FULL=1; else about POINTS of them, and those where psycopg alone raised its own error)
        points = sorted(set(range(1, total + 1, 1 if FULL else max(1, total // POINTS))) | set(driver.values()))
        wrong, raised = [], 0
        for at in points:
            outcome, _, fired_at = worker.submit(_injected, ledger, at).result(30)
            raised += outcome == "Injected"
            if outcome not in ("Injected", "returned"):
                wrong.append((fired_at, outcome))
            slots = led.db._pool.qsize()
            if slots != PG_POOL:
                gc.collect()  # a slot an interrupted frame dropped comes back when the frame is collected
                slots = led.db._pool.qsize()
            assert slots == PG_POOL, f"{PG_POOL - slots} pool slots lost after the exception at {fired_at}"
            assert _idle_in_transaction(conninfo, app) == [], f"a backend idle in a transaction after {fired_at}"
            assert worker.submit(_injected, ledger, 10**9).result(30)[0] == "returned", fired_at
        figure(
            f"pipeline interruption (postgresql): {total} bytecodes of psycopg's pipeline per executemany; psycopg "
            f"alone raised its own error in place of the interruption at {len(driver)} points"
            f"{'' if FULL else ' (looked for the first 3)'} ({sorted(driver)[:3]}); through the ledger ({len(points)} points) the interruption raised at "
            f"{raised}, another error at {len(wrong)}"
        )
        assert driver, "psycopg never replaced the interruption with its own error: the fault was not reproduced"
        assert wrong == [], wrong[:5]
        # A point past the end of a run's pipeline never fires ("returned"): how many bytecodes one executemany
        # takes depends on how often psycopg finds the socket not ready yet, which a loaded machine changes (CI saw
        # 59 of 68 fire beside the other workers, all 68 alone). Most must fire for the test to mean anything.
        assert raised >= 0.75 * len(points), (raised, len(points))
    finally:
        worker.shutdown(wait=False)
        led.close()


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_a_transient_error_is_still_retried_and_a_timeout_error_is_not(db, request):
    """The interruption rule leaves the retry alone: a transient database error is retried, also in a transaction run
    while a timeout is being handled (a job parked after its wait was cut short: the timeout is the context of every
    error raised in it, and is not this transaction's); a ``TimeoutError`` (Prefect's ``TaskRunTimeoutError`` is one)
    raised inside a transaction is raised at once, neither retried nor wrapped."""
    led = Ledger(request.getfixturevalue("sqlite_url" if db == "sqlite" else "pg_url"))
    make_lane(led)
    transient = (
        sqlite3.OperationalError("database is locked")
        if db == "sqlite"
        else psycopg.errors.SerializationFailure("could not serialize access")
    )
    calls = []

    def flaky(cur):
        calls.append(1)
        if len(calls) < 3:
            raise transient
        return "ok"

    try:
        assert led.db.transaction(flaky) == "ok" and len(calls) == 3
        calls.clear()
        try:
            raise Injected()
        except Injected:  # cleaning up after a timeout: the transaction's errors carry it as their context
            assert led.db.transaction(flaky) == "ok" and len(calls) == 3
        calls.clear()

        def timed_out(cur):
            calls.append(1)
            raise TimeoutError("task run exceeded its timeout")

        with pytest.raises(TimeoutError) as info:
            led.db.transaction(timed_out)
        assert len(calls) == 1 and not isinstance(info.value, DatabaseError)
    finally:
        led.close()
