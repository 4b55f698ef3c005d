"""Issue 10 item 1: on PostgreSQL, a settle (or a reap) of attempt 1 racing the retry of the same
keyed job (attempt 2, a reopen through ``submit``) released the reservation twice.

``submit`` read the job by key before taking the lane lock and ``reopen`` trusted that stale
``state == 'leased'``: after the settle committed, the reopen released the same reservation again,
``reserved``/``leased`` fell below the leased jobs and the next tick admitted past the ceiling.
Nothing widens the window here: two connections are started together, round after round, and
the tables are then read with our own SQL (not the ledger's audit).
"""

from __future__ import annotations

import threading
import time

import pytest

from lane_plugin import Ledger

from .conftest import _libpq_url, assert_audit_clean, figure, make_lane, reps

CEILING, EST = 1000, 100


def _own_sql(pg_url: str):
    """A plain psycopg connection to the test's schema (independent of the ledger's code)."""
    import psycopg

    base, _, query = pg_url.partition("?")
    options = query.split("options=", 1)[1].split("&")[0].replace("%3D", "=")
    return psycopg.connect(_libpq_url(base), autocommit=True, options=options)


def _drift(sql) -> tuple[int, int, int, int]:
    """(lane reserved, Σ est of leased jobs, lane leased, count of leased jobs)."""
    reserved, leased = sql.execute("select reserved, leased from lane where name = 'free'").fetchone()
    est, n = sql.execute(
        "select coalesce(sum(est), 0), count(*) from job where lane = 'free' and state = 'leased'"
    ).fetchone()
    return reserved, int(est), leased, n


def _together(*fns) -> list:
    """Run each fn in its own thread, released at the same instant; returns results (or exceptions)."""
    start = threading.Barrier(len(fns))
    out: list = [None] * len(fns)

    def run(i, fn):
        start.wait()
        try:
            out[i] = fn()
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


@pytest.mark.postgres
def test_settle_or_reap_racing_a_reopen_releases_the_reservation_once(pg_url):
    led = Ledger(pg_url)
    make_lane(led, ceiling=CEILING, max_attempts=10, lease_seconds=4000.0)
    settler, retrier = Ledger(pg_url), Ledger(pg_url)
    reaper = Ledger(pg_url, clock=lambda: time.time() + 7200)  # every round's lease has expired for it
    sql = _own_sql(pg_url)
    # A long job holding 900 of the 1,000 for the whole test (its lease outlives the reaper's clock: the
    # reaper's first reap bounds it to its own now + lease_seconds, still 4,000 s past every reaper's now
    # of the test): a double release then leaves the counters silently low instead of tripping reserved >= 0.
    ballast = led.submit("ballast", CEILING - EST)
    assert [x.job_id for x in led.tick()] == [ballast]
    sql.execute("update job set lease_until = 1e12 where id = %s", (ballast,))
    rounds = reps(60, 300)
    broken = {"settle": 0, "reap": 0}
    seen: list[str] = []
    deficit = 0
    for i in range(rounds):
        kind = "settle" if i % 2 == 0 else "reap"
        key = f"race-{i}"
        job = led.submit("s", EST, key=key)
        [lease] = led.tick()
        assert (lease.job_id, lease.attempt) == (job, 1)
        first = (lambda job=job: settler.settle(job, 0, attempt=1)) if kind == "settle" else reaper.reap
        results = _together(first, lambda key=key: retrier.submit("s", EST, key=key, attempt=2))
        errors = [r for r in results if isinstance(r, Exception)]
        reserved, est, leased, n = _drift(sql)
        if errors or est - reserved != deficit:  # (a check constraint may refuse reserved < 0)
            broken[kind] += 1
            seen.extend(f"{type(e).__name__}: {str(e)[:160]}" for e in errors)
            deficit = est - reserved
        if errors:  # the reopen failed: retire the job, keep what the counters say
            sql.execute("update job set state = 'failed' where id = %s and state = 'new'", (job,))
            continue
        # whoever won, the job now waits as attempt 2: lease it and finish it
        row = sql.execute("select state, attempt from job where id = %s", (job,)).fetchone()
        assert row == ("new", 2), (kind, row)
        [again] = led.tick()
        assert (again.job_id, again.attempt) == (job, 2)
        led.settle(again, 0)
        if kind == "settle":
            assert led.settle(job, 0, attempt=1).actual == 0  # billed once (live or late), or a replay
    figure(
        f"reopen race pg: {rounds} rounds of settle-or-reap of attempt 1 against submit(attempt=2), two "
        f"connections released together: {broken['settle']} settle and {broken['reap']} reap rounds released "
        f"the reservation twice or failed on the counters' >= 0 check (lane reserved {deficit} below the "
        "leased jobs at the end, own SQL)"
    )
    # the next tick must not admit past the ceiling whatever happened above
    for _ in range(CEILING // EST + 5):
        led.submit("s", EST)
    led.tick()
    spent, committed = sql.execute(
        "select (select spent from lane where name = 'free'), "
        "(select coalesce(sum(est), 0) from job where lane = 'free' and state = 'leased')"
    ).fetchone()
    figure(f"reopen race pg: then one tick: {spent} spent + {committed} leased (own SQL) against the ceiling {CEILING}")
    sql.close()
    assert broken == {"settle": 0, "reap": 0}, seen[:3]
    assert spent + committed <= CEILING
    led.settle(ballast, 0, attempt=1)
    assert_audit_clean(led)
