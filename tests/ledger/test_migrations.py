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
