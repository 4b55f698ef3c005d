"""The Alembic migrations create exactly the SQLModel schema, on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3

import pytest

from lane_plugin import Ledger, NotALedger
from lane_plugin.ledger.schema import HEAD_REVISION


def test_migrated_schema_equals_the_models(ledger_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from lane_plugin.ledger.models import metadata

    led = Ledger(ledger_url)
    assert led.upgrade() == HEAD_REVISION
    engine = create_engine(led.url.sqlalchemy_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_upgrade_is_idempotent_and_first_use_creates_the_schema(tmp_path):
    url = f"sqlite:///{tmp_path / 'sub' / 'fresh.db'}"
    led = Ledger(url)
    assert led.lanes()  # first use: created and upgraded
    assert Ledger(url).upgrade() == HEAD_REVISION


def test_a_database_that_is_not_a_ledger_is_refused_without_writing(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("create table customers (id integer primary key)")
    conn.commit()
    conn.close()
    with pytest.raises(NotALedger, match="not a lane ledger"):
        Ledger(f"sqlite:///{path}").lanes()
    tables = {r[0] for r in sqlite3.connect(path).execute("select name from sqlite_master where type='table'")}
    assert tables == {"customers"}


def test_a_file_that_is_not_a_database_is_refused(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not SQLite\n" * 200)
    with pytest.raises(NotALedger, match="not a lane ledger"):
        Ledger(f"sqlite:///{path}").lanes()
    assert path.read_text().startswith("hello")


def test_a_ledger_at_0001_with_work_in_flight_upgrades_to_the_new_admission(ledger_url):
    """Existing jobs get rate_cost = est, their place in the new order, and their run's class."""
    from lane_plugin.ledger.db import Database
    from lane_plugin.ledger.schema import upgrade
    from lane_plugin.ledger.url import parse_url

    db = Database(parse_url(ledger_url))
    upgrade(db, "0001")
    db._checked = True  # write at 0001: no upgrade on first use

    def seed(cur):
        cur.execute("update lane set max_wait_seconds = 100, burst_tokens = 1000, ceiling = 10000 where name = 'free'")
        cur.execute("insert into lane_run (lane, run_key, started_at) values ('free', 'r1', 5)")
        for jid, est, run_key, state in (("a", 500, "r1", "new"), ("b", 200, None, "new"), ("c", 300, "r2", "leased")):
            leased = state == "leased"
            cur.execute(
                "insert into job (id, lane, stage, est, actual, state, attempt, lease_attempt, lease_until, lease_token, "
                "run_key, created_at, wait_since) values (:id, 'free', 's', :e, 0, :st, 1, :la, :lu, :tok, :r, 10, 10)",
                {"id": jid, "e": est, "r": run_key, "st": state, "la": int(leased), "lu": 1e12 if leased else 0,
                 "tok": "t" if leased else None},
            )  # fmt: skip
        cur.execute("update lane set reserved = 300, leased = 1, window_used = 300, window_start = 10 where name = 'free'")

    db.transaction(seed)
    db.close()
    led = Ledger(ledger_url)
    assert led.upgrade() == HEAD_REVISION
    jobs = {j: led.job(j) for j in "abc"}
    assert [jobs[j]["rate_cost"] for j in "abc"] == [500, 200, 300]
    assert [jobs[j]["prio"] for j in "abc"] == [10 + 500 * 0.1, 10 + 200 * 0.1, 10 + 300 * 0.1]
    assert [bool(jobs[j]["finishing"]) for j in "abc"] == [True, False, False]
    lane = led.lane("free")
    assert (lane.rate_basis, lane.finishing, lane.window_used) == ("request", 0, 0)  # an empty window to start
    assert led.audit(grace=10**9) == []
    led.close()
