"""An outside review: ``Ledger.rows`` (a caller's own read-only query) must not change the session the
ledger's own writes run on afterwards.

A read-only transaction refuses writes, but not session settings: ``set_config(..., false)`` on
PostgreSQL or a pragma on SQLite outlived the query on the pooled (or thread's) connection, so the
next settlement ran with ``synchronous_commit = off`` (acknowledged, yet lost if the server crashes),
a 1 ms ``statement_timeout``, a 1 ms busy timeout, or CHECK constraints ignored; a session advisory
lock was held for good.
"""

from __future__ import annotations

import pytest

from lane_plugin import Ledger


@pytest.fixture
def led(ledger_url):
    ledger = Ledger(ledger_url)
    ledger.set_lane("t", ceiling=1_000, allowance=1_000)
    yield ledger
    ledger.close()


def setting(led, name: str):
    sql = f"show {name}" if led.db.dialect == "postgresql" else f"pragma {name}"
    return led.db.transaction(lambda cur: cur.scalar(sql), write=False)


def test_a_query_cannot_change_the_settings_later_writes_run_with(led):
    if led.db.dialect == "postgresql":
        attacks = {"synchronous_commit": "off", "statement_timeout": "1", "lock_timeout": "1"}
        before = {k: setting(led, k) for k in attacks}
        for name, value in attacks.items():
            led.rows(f"select set_config('{name}', '{value}', false)")
    else:
        attacks = {"busy_timeout": 1, "ignore_check_constraints": 1, "foreign_keys": 1}
        before = {k: setting(led, k) for k in attacks}
        for name, value in attacks.items():
            led.rows(f"pragma {name} = {value}")
    assert {k: setting(led, k) for k in attacks} == before
    job = led.submit("s", 10, "t")
    [lease] = led.tick("t")
    assert lease.job_id == job and led.settle(lease, 7).actual == 7
    assert led.audit() == []


def test_a_query_cannot_leave_a_lock_or_a_database_attached(led):
    if led.db.dialect == "postgresql":
        import psycopg

        led.rows("select pg_advisory_lock(4242)")
        with psycopg.connect(**led.url.conninfo, autocommit=True) as other:
            assert other.execute("select pg_try_advisory_lock(4242)").fetchone()[0], "the query's lock outlived it"
    else:
        led.rows("attach database ':memory:' as other")
        names = led.db.transaction(lambda cur: [r[1] for r in cur.all("pragma database_list")], write=False)
        assert names == ["main"]


@pytest.mark.parametrize("sql", ["commit", "release savepoint lane_rows"])
def test_a_query_that_ends_its_transaction_is_refused_at_once_naming_it(led, sql):
    import time

    from lane_plugin import InvalidInput, LaneError

    t0 = time.monotonic()
    with pytest.raises(InvalidInput if led.db.dialect == "postgresql" else LaneError) as err:
        led.rows(sql)
    assert time.monotonic() - t0 < 10.0  # not retried as if the database were away (60 s)
    if led.db.dialect == "postgresql":
        assert err.value.field == "sql"
    led.submit("s", 10, "t")
    [lease] = led.tick("t")
    assert led.settle(lease, 7).actual == 7 and led.audit() == []
