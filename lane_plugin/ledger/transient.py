"""Which database errors a retry of the whole transaction gets past (:func:`_is_transient`), and which
exceptions are an interruption rather than an error of the database's (:func:`interruption`): the rules
:class:`lane_plugin.ledger.db.Database` retries and gives up by."""

from __future__ import annotations

import sqlite3

# What a retry of the whole transaction gets past: a serialization failure, a deadlock, a lock not available,
# too many connections, a server shut down, crashed or not up yet, class 08 (the connection). Anything else (a
# wrong database, a refused login, a denied permission, a full disk) fails alike for all of ``retry_for``.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03", "53300", "57P01", "57P02", "57P03"})
# libpq's words, with no SQLSTATE (connecting, a session lost), for a server not there yet or any more.
TRANSIENT_TEXT = (
    "connection refused",
    "closed the connection",
    "closed unexpectedly",
    "connection is closed",
    "connection is lost",
    "starting up",
    "shutting down",
    "in recovery mode",
    "not yet accepting",
    "terminating connection",
    "too many clients",
    "connection slots are reserved",
    "timeout expired",
    "timed out",
    "could not receive data",
    "could not send data",
    "consuming input failed",
    "ssl syscall error",
    "eof detected",
    "connection reset",
    "broken pipe",
    "no route to host",
    "network is unreachable",
    "temporary failure in name resolution",
    "lost synchronization",
)

# What a server says while it restarts: transient even on a process's first connection.
SERVER_RESTARTING = ("starting up", "shutting down", "in recovery mode", "not yet accepting", "too many clients")


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.OperationalError):
        msg = str(exc).lower()
        return "locked" in msg or "busy" in msg
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        return False
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state:
        return state in TRANSIENT_SQLSTATES or state.startswith("08")
    msg = str(exc).lower()
    return isinstance(exc, psycopg.OperationalError) and any(text in msg for text in TRANSIENT_TEXT)


def interruption(exc: BaseException, handled: BaseException | None = None) -> BaseException | None:
    """The interruption behind ``exc``, if any: ``exc`` itself or an exception it was raised while handling that is
    not an error of the database's (a ``BaseException`` such as Prefect's ``CancelledError``, a ``KeyboardInterrupt``;
    a ``TimeoutError`` such as Prefect's ``TaskRunTimeoutError``). The chain is followed back to ``handled`` only:
    the exception the caller was handling when the transaction began (a transaction run to clean up after a
    timeout, e.g. parking a job whose wait it ended, is not itself interrupted by it, and is retried as any other).

    An exception raised asynchronously into a thread (Prefect's timeout) inside the driver's own clean-up can be
    replaced by the driver's error about the state it was left in: psycopg's pipeline, interrupted while it synced,
    raises "cannot exit pipeline mode while busy" from a ``finally``. The interruption is what happened (the task timed
    out); the connection is in no state to be reused."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and cur is not handled and id(cur) not in seen:
        seen.add(id(cur))
        if not isinstance(cur, Exception) or (isinstance(cur, TimeoutError) and not _is_db_error(cur)):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def _is_db_error(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.Error) or type(exc).__module__.startswith("psycopg")
