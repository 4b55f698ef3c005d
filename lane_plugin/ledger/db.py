"""Connections and transactions over the DB-API (sqlite3 or psycopg).

One connection per thread and process. Every ledger operation is one function
run inside :meth:`Database.transaction`; transient failures (SQLite busy, a
PostgreSQL restart, a killed session, a serialization failure) roll back and
run the *whole* function again, which is safe because every write the ledger
makes is idempotent by id.
"""

from __future__ import annotations

import os
import queue
import random
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import DatabaseError, LaneError, NoLedger, NotALedger
from ..settings import lane_settings
from . import queries
from .cursor import Cursor as Cursor  # (re-exported: the ledger modules import it from here)
from .cursor import DatabaseClock, Stats
from .pool import PG_POOL as PG_POOL  # (re-exported)
from .pool import Slot, discard_slot, idle, new_pool
from .pool import empty as empty_slot
from .schema import HEAD_REVISION, check_revision, upgrade
from .transient import SERVER_RESTARTING, _is_transient, interruption
from .url import DatabaseURL, make_default_home

T = TypeVar("T")

TRY_LOCK_MS = 50  # SQLite: how long a try-locking tick waits for another writer before it gives up
# The retry jitter's own generator: drawn from the global random module, the gate's watcher threads moved
# a user's seeded sequence (and Hypothesis's draws, read as "random inside strategies") from another thread.
JITTER = random.Random()


class Busy(Exception):
    """A try-lock found the lane's ticker (or, on SQLite, the database's writer) busy: nothing was done."""


def _one_line(exc: BaseException, url: DatabaseURL) -> str:
    return " ".join(url.scrub(str(exc)).split())


class Database:
    """The ledger's database: connections, transactions and schema checks."""

    def __init__(self, url: DatabaseURL, *, busy_timeout: float = 30.0, retry_for: float = 60.0, create: bool = True):
        self.url = url
        self.create = create
        self.dialect = url.dialect
        self.busy_timeout = busy_timeout
        self.retry_for = retry_for
        self._local = threading.local()
        self._checked = False
        self.clock = DatabaseClock()
        self._ever_connected = False
        self._check_lock = threading.Lock()
        self.stats = Stats()
        self.backend_pids: set[int] = set()
        # PostgreSQL's pool size is read when the ledger opens (a bad LANE_PG_POOL fails here, named); SQLite has none
        self.pool_size = lane_settings().pg_pool if url.dialect == "postgresql" else 0
        self._pool = new_pool(self.pool_size)
        self._pool_pid = os.getpid()

    # -- connections ---------------------------------------------------------
    def _connect(self):
        if self.dialect == "sqlite":
            path = Path(self.url.path)
            if path.is_dir():
                raise NotALedger(f"{path} is a directory, not a ledger database")
            if not self.create and not path.exists():
                raise self._no_ledger()
            if not path.parent.is_dir():
                make_default_home(self.url)
            try:
                conn = sqlite3.connect(
                    str(path), timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
                )
            except OSError as exc:  # no such directory, permission denied...: the caller's URL is wrong
                raise DatabaseError(f"cannot open {self.url}: {exc.strerror or exc}") from None
            try:
                conn.execute(queries.sqlite_busy_timeout(self.busy_timeout * 1000))
                conn.execute(queries.SQLITE_WAL)
                conn.execute(queries.SQLITE_SYNCHRONOUS_NORMAL)
            except sqlite3.DatabaseError as exc:
                conn.close()
                if "not a database" in str(exc) or "malformed" in str(exc):
                    raise NotALedger(f"{path} is not a lane ledger (not an SQLite database)") from None
                raise
            return conn
        import psycopg

        try:
            conn = psycopg.connect(**{"connect_timeout": 10, **self.url.conninfo}, autocommit=True)
        except psycopg.OperationalError as exc:
            # A wrong URL fails fast; a restart is waited out, even by a process whose first connection meets it
            # (the server's own words say so: a refused connection could as well be a wrong port).
            restarting = any(w in str(exc).lower() for w in SERVER_RESTARTING)
            if not (self._ever_connected or restarting) or not _is_transient(exc):
                raise DatabaseError(f"cannot connect to {self.url}: {_one_line(exc, self.url)}") from None
            raise
        except (UnicodeError, ValueError) as exc:  # e.g. a host name that is not valid IDNA
            raise DatabaseError(f"cannot connect to {self.url}: {_one_line(exc, self.url)}") from None
        self._ever_connected = True
        self.backend_pids.add(conn.info.backend_pid)  # the watcher ignores this process's own NOTIFYs
        return conn

    def connection(self):
        conn = getattr(self._local, "conn", None)
        if (
            conn is not None
            and self.dialect == "sqlite"
            and self._local.pid == os.getpid()
            and (conn.in_transaction or self._local.short_busy)
        ):
            self._drop(conn)  # left mid-transaction (or on the try-lock's short busy timeout) by an interrupted thread
            conn = None
        if conn is None or self._local.pid != os.getpid():
            conn = self._connect()
            self._local.conn = conn
            self._local.pid = os.getpid()
            self._local.short_busy = False
        return conn

    def _drop(self, conn) -> None:
        """Roll back and close this thread's connection: it is never used again (the next transaction opens
        another). For a transaction an exception interrupted, the rollback already happened (sqlite3's own
        ``__exit__``); closing ends anything left."""
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        try:
            conn.close()  # C: an uncommitted transaction is rolled back, the write lock released
        except Exception:
            pass

    def discard(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None and self._local.pid == os.getpid():
            try:
                conn.close()
            except Exception:
                pass

    def close(self) -> None:
        self.discard()
        if self._pool_pid != os.getpid():
            return
        idle = []
        while True:  # the idle connections are closed; their slots stay (a later transaction connects again)
            try:
                idle.append(self._pool.get_nowait())
            except queue.Empty:
                break
        for slot in idle:
            empty_slot(slot)
            self._pool.put(slot)

    # -- PostgreSQL's pool -----------------------------------------------------
    def _checkout(self) -> Slot:
        """PostgreSQL: a slot of this process's pool of at most ``pool_size`` (a thousand waiting threads
        share a few connections; each transaction holds one only while it runs). See :class:`~lane_plugin.ledger.pool.Slot`."""
        if self._pool_pid != os.getpid():  # forked: the parent's connections are not ours
            self._pool, self._pool_pid = new_pool(self.pool_size), os.getpid()
        return self._pool.get()

    # -- transactions --------------------------------------------------------
    def _pg_once(self, fn: Callable[[Cursor], T], write: bool, fault: str | None) -> T:
        # The slot held, in a list: taking it (``append(get())``) and giving it back (``put(pop())``) are single
        # C calls, so an exception raised asynchronously into this thread (Prefect's timeout) leaves it either
        # here, for the ``finally`` to close and give back, or on the evaluation stack only, whose drop puts a
        # fresh slot in its place (``Slot.__del__``). Never both: a slot is never given back twice.
        held: list[Slot] = []
        handled = sys.exc_info()[1]  # what the caller is handling (a timeout it cleans up after), if anything
        try:
            held.append(self._checkout())
            conn = held[0].conn
            if conn is None or conn.closed:
                held[0].conn = None
                conn = held[0].conn = self._connect()
            # A read sees one snapshot of every table (READ COMMITTED gives each statement its own:
            # `lane status` could count a lease in one query and miss it in the next), read-only.
            # Set on the connection, it rides on the BEGIN: no extra round trip.
            snapshot = None if write else True
            if conn.read_only is not snapshot:
                from psycopg import IsolationLevel

                conn.read_only = snapshot
                conn.isolation_level = None if write else IsolationLevel.REPEATABLE_READ
            with conn.transaction(), conn.cursor() as raw:
                cur = Cursor(raw, "postgresql", self.clock, self.stats)
                result = fn(cur)
                if fault:
                    fault_point(fault + ".before_commit")
            if cur.locked_at is not None:  # committed: the lane's lock is released now
                self.stats.lock_holds.append(time.perf_counter() - cur.locked_at)
            if idle(conn):  # no transaction left open (a backend "idle in transaction" holds its locks)
                self._pool.put(held.pop())
            return result
        except Exception as exc:
            stopped = interruption(exc, handled)
            if stopped is not None:  # a timeout: its connection is closed (below), and the timeout is what is raised
                if stopped is exc:
                    raise
                raise stopped from None  # (the driver's error, e.g. psycopg's "cannot exit pipeline mode while busy")
            # an error the transaction's own exit rolled back (a constraint, a refused input): the connection
            # is reused; a restart, a killed session, anything transient: closed (below)
            if held and not _is_transient(exc) and idle(held[0].conn):
                self._pool.put(held.pop())
            raise
        finally:
            if held:  # interrupted (or failed on the connection itself): closed, never reused
                discard_slot(self._pool, held)

    def _sqlite_once(self, fn: Callable[[Cursor], T], write: bool, try_lock: bool, fault: str | None) -> T:
        conn = self.connection()
        try:
            # sqlite3's own __exit__ (C, not interruptible) commits, or rolls back on any exception: also one
            # raised asynchronously into this thread (Prefect's timeout) right after BEGIN IMMEDIATE won the
            # lock, before any Python-level try could be entered. No write transaction outlives the call.
            with conn:
                if try_lock:  # the try-lock: wait for the writer's lock only briefly, then give up (Busy)
                    self._local.short_busy = True
                    conn.execute(queries.sqlite_busy_timeout(TRY_LOCK_MS))
                t0 = time.perf_counter()
                try:
                    conn.execute(queries.SQLITE_BEGIN_WRITE if write else queries.SQLITE_BEGIN_READ)
                finally:
                    if try_lock:
                        conn.execute(queries.sqlite_busy_timeout(self.busy_timeout * 1000))
                        self._local.short_busy = False
                t1 = time.perf_counter()
                if write:
                    self.stats.lock_waits.append(t1 - t0)
                result = fn(Cursor(conn.cursor(), "sqlite", stats=self.stats))
                if not conn.in_transaction:  # a COMMIT, ROLLBACK or RELEASE ran inside it: what follows is not atomic
                    raise DatabaseError(
                        "the ledger's transaction was ended inside it (a COMMIT, ROLLBACK or "
                        "RELEASE in the statement): refused"
                    )
                if fault:
                    fault_point(fault + ".before_commit")
            if write:
                self.stats.lock_holds.append(time.perf_counter() - t1)
            return result
        except BaseException as exc:
            if not isinstance(exc, Exception) or conn.in_transaction:  # interrupted: never used again
                self._drop(conn)
            raise

    def transaction(
        self, fn: Callable[[Cursor], T], *, write: bool = True, fault: str | None = None, try_lock: bool = False
    ) -> T:
        """Run ``fn(cursor)`` in one transaction, retrying the whole of it when transient.

        ``try_lock``: on SQLite, give up with :class:`Busy` when another writer holds the database for
        more than ``TRY_LOCK_MS`` (a tick that finds another running returns at once); ``fn`` raising
        :class:`Busy` (PostgreSQL's advisory try-lock) is not retried either.
        """
        deadline = time.monotonic() + self.retry_for
        delay = 0.005
        while True:
            try:
                self.ensure_schema()
                if self.dialect == "sqlite":
                    result = self._sqlite_once(fn, write, try_lock, fault)
                else:
                    result = self._pg_once(fn, write, fault)
                self.stats.commits += 1
                self.stats.writes += write
                if fault:
                    fault_point(fault + ".after_commit")
                return result
            except Busy:
                self.stats.busy += 1
                raise
            except Exception as exc:
                if try_lock and self.dialect == "sqlite" and _is_transient(exc):
                    self.stats.busy += 1
                    raise Busy() from None
                if not _is_transient(exc):
                    raise self._wrap(exc) from exc
                if time.monotonic() > deadline:
                    raise DatabaseError(f"database {self.url} unavailable: {_one_line(exc, self.url)}") from None
                time.sleep(delay * (0.5 + JITTER.random()))
                delay = min(delay * 2, 1.0)

    def _no_ledger(self) -> NoLedger:
        return NoLedger(
            f"no ledger at {self.url}: nothing was created (check --db or LANE_DATABASE_URL; "
            "'lane db upgrade' creates one)"
        )

    def _wrap(self, exc: Exception) -> Exception:
        if isinstance(exc, LaneError):
            return exc
        if isinstance(exc, (sqlite3.Error,)) or type(exc).__module__.startswith("psycopg"):
            return DatabaseError(f"database error on {self.url}: {_one_line(exc, self.url)}")
        return exc

    # -- schema --------------------------------------------------------------
    def tables(self) -> set[str]:
        conn = self.connection()
        if self.dialect == "sqlite":
            rows = conn.execute(queries.DB_TABLES_SELECT_SQLITE_MASTER).fetchall()
        else:
            with conn.cursor() as cur:
                cur.execute(queries.DB_TABLES_SELECT_PG_TABLES)
                rows = cur.fetchall()
        return {r[0] for r in rows}

    def revision(self) -> str | None:
        if "alembic_version" not in self.tables():
            return None
        conn = self.connection()
        if self.dialect == "sqlite":
            row = conn.execute(queries.DB_REVISION).fetchone()
        else:
            with conn.cursor() as cur:
                cur.execute(queries.DB_REVISION)
                row = cur.fetchone()
        return row[0] if row else None

    def ensure_schema(self) -> None:
        """Create and upgrade a fresh ledger on first use; refuse a foreign database."""
        if self._checked:
            return
        with self._check_lock:
            if self._checked:
                return
            try:
                rev = self.revision()
                if rev != HEAD_REVISION:
                    tables = self.tables()
                    if rev is None and not self.create and not tables - {"alembic_version"}:
                        raise self._no_ledger()
                    if rev is None and tables - {"alembic_version"}:
                        raise NotALedger(
                            f"{self.url} is not a lane ledger (it has tables {sorted(tables)[:5]} "
                            "but no lane_plugin schema)"
                        )
                    check_revision(self, rev)
                    upgrade(self)
            except sqlite3.DatabaseError as exc:
                if "not a database" in str(exc):
                    raise NotALedger(f"{self.url} is not a lane ledger (not an SQLite database)") from None
                raise self._wrap(exc) from exc
            except OSError as exc:  # the migration lock file could not be made
                raise DatabaseError(f"cannot create the ledger in {self.url}: {exc.strerror or exc}") from None
            except Exception as exc:
                # Alembic speaks SQLAlchemy: hand on the driver's own error, so that a server
                # restart during the migration is retried and anything else is a DatabaseError.
                orig = getattr(exc, "orig", None)
                if type(exc).__module__.startswith("sqlalchemy") and isinstance(orig, Exception):
                    raise orig from exc
                raise
            finally:
                if self.dialect == "postgresql":  # the checks' own connection: transactions use the pool's
                    self.discard()
            self._checked = True


def fault_point(name: str) -> None:
    """Test hook: SIGKILL this process at ``name`` when ``LANE_FAULT`` names it.

    Enabled only by the environment variable, used by tests/faults to prove
    that a crash inside (or just after) a transaction loses nothing.
    """
    if os.environ.get("LANE_FAULT") != name:
        return
    marker = os.environ.get("LANE_FAULT_MARKER")
    if marker:
        Path(marker).write_text(name)
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
