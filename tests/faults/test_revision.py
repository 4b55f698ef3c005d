"""Issue 10 item 6: a ledger at an Alembic revision this version does not know.

A newer lane_plugin's ledger, or another application's Alembic schema at the ledger URL: before
the fix Alembic's ``CommandError`` ("Can't locate revision ...") came out as a traceback and exit 1.
Now: one line naming the revision, exit 8 from the CLI, :class:`UnknownRevision` from the API;
nothing in the database is touched.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from lane_plugin import Ledger
from lane_plugin.errors import DatabaseError, LaneError

from ..cli.stderr import error_lines
from .conftest import late_figure, pg_admin

SEEN: dict = {}


def _lane(*args) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lane")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "lane_plugin.cli"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120, env=dict(os.environ))


def _sql(url: str, statements: list[str]) -> None:
    """Our own SQL on the database, not the ledger's."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.split("sqlite:///", 1)[1])
        for s in statements:
            conn.execute(s)
        conn.commit()
        conn.close()
        return
    schema = url.split("search_path%3D", 1)[1]
    admin = pg_admin()
    for s in statements:
        admin.execute(f"set search_path to {schema}; {s}")
    admin.close()


def _version(url: str) -> str:
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.split("sqlite:///", 1)[1])
        try:
            return conn.execute("select version_num from alembic_version").fetchone()[0]
        finally:
            conn.close()
    schema = url.split("search_path%3D", 1)[1]
    admin = pg_admin()
    try:
        return admin.execute(f"select version_num from {schema}.alembic_version").fetchone()[0]
    finally:
        admin.close()


def _check_refused(url: str, revision: str, label: str) -> None:
    with pytest.raises(LaneError) as info:
        led = Ledger(url, retry_for=1.0)
        try:
            led.tick("free")
        finally:
            led.close()
    exc = info.value
    assert type(exc).__name__ == "UnknownRevision" and isinstance(exc, DatabaseError), repr(exc)
    assert revision in str(exc) and "\n" not in str(exc), str(exc)
    for args in (["lanes"], ["tick", "--lane", "free"], ["db", "upgrade"]):
        r = _lane("--db", url, *args)
        assert r.returncode == 8, (label, args, r.returncode, r.stderr[-600:])
        lines = error_lines(r.stderr)  # after the line naming the ledger
        assert len(lines) == 1 and lines[0].startswith("lane: error: ") and revision in lines[0], r.stderr[-600:]
        assert "Traceback" not in r.stderr
    assert _version(url) == revision, "the refused ledger was changed"
    SEEN.setdefault(label, []).append(url.split(":")[0].split("+")[0])


def test_newer_revision_is_refused_in_one_line(ledger_url):
    led = Ledger(ledger_url)
    led.set_lane("free", allowance=1000, ceiling=800)
    led.close()
    _sql(ledger_url, ["update alembic_version set version_num = '0099_from_the_future'"])
    _check_refused(ledger_url, "0099_from_the_future", "newer")


def test_another_applications_schema_is_refused_in_one_line(ledger_url):
    _sql(
        ledger_url,
        [
            "create table alembic_version (version_num varchar(32) not null primary key)",
            "insert into alembic_version values ('ae1027a6acf')",
            "create table users (id integer primary key, name varchar(40))",
        ],
    )
    _check_refused(ledger_url, "ae1027a6acf", "foreign")


def _figure() -> str | None:
    if not SEEN.get("newer") or not SEEN.get("foreign"):
        return None
    return (
        f"unknown revision ({', '.join(sorted(set(SEEN['newer']) & set(SEEN['foreign'])))}): a newer ledger and "
        "another app's Alembic schema refused by the API (UnknownRevision) and by lane lanes / tick / db upgrade "
        "in one line naming the revision, exit 8, database untouched (before the fix: CommandError traceback, "
        "exit 1)"
    )


late_figure(_figure)
