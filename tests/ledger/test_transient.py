"""Which database failures the ledger waits out (retrying the whole transaction for ``retry_for``) and
which it reports at once: a restart, a killed session, a serialization failure or a deadlock pass; a
wrong database name, a refused login, a denied permission or a bad host name never will, so waiting
60 s before saying so only hides the cause."""

from __future__ import annotations

import sqlite3
import time
import uuid

import psycopg
import pytest
from psycopg import errors as pg

from lane_plugin import Ledger
from lane_plugin.errors import DatabaseError
from lane_plugin.ledger.transient import _is_transient

from ..conftest import _pg_connect_kwargs, postgres_or_skip

REFUSED = (
    'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused\n\tIs the server running'
)
FATAL = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  '


@pytest.mark.parametrize(
    "exc",
    [
        pg.SerializationFailure("could not serialize access"),
        pg.DeadlockDetected("deadlock detected"),
        pg.LockNotAvailable("could not obtain lock"),
        pg.AdminShutdown("terminating connection due to administrator command"),
        pg.CrashShutdown("terminating connection because of crash of another server process"),
        pg.CannotConnectNow("the database system is starting up"),
        pg.ConnectionFailure("connection failure"),
        pg.TooManyConnections("sorry, too many clients already"),
        psycopg.OperationalError(REFUSED),
        psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly"),
        psycopg.OperationalError("the connection is closed"),
        psycopg.OperationalError(FATAL + "the database system is starting up"),
        psycopg.OperationalError(FATAL + "the database system is shutting down"),
        psycopg.OperationalError(FATAL + "sorry, too many clients already"),
        psycopg.OperationalError("connection timeout expired"),
        sqlite3.OperationalError("database is locked"),
        sqlite3.OperationalError("database table is busy"),
    ],
    ids=lambda e: f"{type(e).__name__}:{str(e)[-40:]}",
)
def test_what_passes_is_retried(exc):
    assert _is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        pg.InvalidCatalogName('database "nope" does not exist'),
        pg.InvalidAuthorizationSpecification("role not permitted"),
        pg.InvalidPassword('password authentication failed for user "u"'),
        pg.InsufficientPrivilege("permission denied"),
        pg.DiskFull("could not extend file"),
        pg.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.OperationalError(FATAL + 'database "nope" does not exist'),
        psycopg.OperationalError(FATAL + 'password authentication failed for user "u"'),
        psycopg.OperationalError(FATAL + 'role "nobody" does not exist'),
        psycopg.OperationalError(FATAL + 'permission denied for database "trust"'),
        psycopg.OperationalError(FATAL + 'no pg_hba.conf entry for host "10.0.0.9", user "u", database "d"'),
        psycopg.OperationalError("failed to resolve host 'db.example.invalid': [Errno -2] Name or service not known"),
        sqlite3.OperationalError("no such table: job"),
    ],
    ids=lambda e: f"{type(e).__name__}:{str(e)[-40:]}",
)
def test_what_never_passes_is_not_retried(exc):
    assert not _is_transient(exc)


def test_a_refused_connection_after_connecting_is_waited_out_then_named(tmp_path):
    """The server went away (a restart): the ledger keeps trying for ``retry_for``, then says it is unavailable."""
    led = Ledger("postgresql+psycopg://root@127.0.0.1:1/lane", retry_for=0.5)
    led.db._ever_connected = True  # as after a first connection: refused now means "restarting", not "wrong URL"
    t0 = time.monotonic()
    with pytest.raises(DatabaseError, match="unavailable: .*Connection refused") as info:
        led.lanes()
    took = time.monotonic() - t0
    assert took >= 0.5 and "\n" not in str(info.value), (took, str(info.value))


def test_a_first_connection_that_meets_a_restart_waits_it_out(monkeypatch):
    """A worker started while the server shuts down or starts up (its first connection ever): the server's own
    words say it is restarting, so the ledger waits it out instead of failing as for a wrong URL."""
    tries = []

    def connect(**kwargs):
        tries.append(time.monotonic())
        if len(tries) < 3:
            raise psycopg.OperationalError(FATAL + "the database system is shutting down")
        raise psycopg.OperationalError(FATAL + 'database "nope" does not exist')  # then: a cause that never passes

    monkeypatch.setattr(psycopg, "connect", connect)
    led = Ledger("postgresql+psycopg://root@127.0.0.1:5432/nope", retry_for=30.0)
    with pytest.raises(DatabaseError, match='database "nope" does not exist'):
        led.lanes()
    assert len(tries) == 3 and not led.db._ever_connected  # two waited out, the third named at once


def _admin():
    return psycopg.connect(**_pg_connect_kwargs(postgres_or_skip()), autocommit=True)


def _url_of(name: str) -> str:
    base = postgres_or_skip().split("?", 1)[0]
    return base.rsplit("/", 1)[0] + "/" + name


@pytest.mark.postgres
def test_a_wrong_database_name_fails_at_once_naming_it():
    name = f"lane_nope_{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    with pytest.raises(DatabaseError) as info:
        Ledger(_url_of(name), retry_for=30.0).lanes()
    took = time.monotonic() - t0
    assert took < 1.0 and name in str(info.value) and "\n" not in str(info.value), (took, str(info.value))


@pytest.mark.postgres
def test_a_database_dropped_under_a_connected_ledger_fails_at_once_naming_it():
    """Connected once, the ledger waits out a refused connection (a restart); a database that no longer
    exists is no restart: it is reported on the next call, not after ``retry_for``."""
    name = f"lane_gone_{uuid.uuid4().hex[:8]}"
    with _admin() as admin:
        admin.execute(f'create database "{name}"')
    try:
        led = Ledger(_url_of(name), retry_for=30.0)
        led.set_lane("free", allowance=100, ceiling=100)
        with _admin() as admin:
            admin.execute(f'drop database "{name}" with (force)')  # terminates the ledger's sessions
        t0 = time.monotonic()
        with pytest.raises(DatabaseError) as info:
            led.lanes()
        took = time.monotonic() - t0
        msg = str(info.value)
        assert took < 1.0 and f'database "{name}" does not exist' in msg and "\n" not in msg, (took, msg)
        led.close()
    finally:
        with _admin() as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')
