"""What the reports, estimators and simulator read from the ledger, as typed queries.

Each function runs inside a read transaction the :class:`~lane_plugin.Ledger`
opens; nothing outside this package writes SQL.
"""

from __future__ import annotations

from ..errors import InvalidInput
from . import queries
from .db import Cursor
from .jobs import ALL_JOB_COLUMNS, get_job

_SETTLED = (
    "id",
    "lane",
    "stage",
    "est",
    "est_version",
    "actual",
    "overage",
    "finished_at",
    "est_input",
    "by_estimate",
    "rate_cost",
)


def _dicts(keys: tuple[str, ...], rows) -> list[dict]:
    return [dict(zip(keys, r)) for r in rows]


def job(cur: Cursor, job_id: str) -> dict:
    get_job(cur, job_id)  # UnknownJob
    row = cur.one(queries.READS_JOB, {"id": job_id})
    return dict(zip(ALL_JOB_COLUMNS, row))


def tail(cur: Cursor, now: float, lane: str | None) -> list[dict]:
    rows = cur.all(queries.READS_TAIL_OF_LANE if lane else queries.READS_TAIL, {"l": lane})
    return [dict(zip(queries.TAIL_KEYS, r), age=now - r[5]) for r in rows]


def settled_jobs(cur: Cursor, now: float, *, lane: str | None, since: float | None) -> list[dict]:
    params: dict = {}
    if lane:
        params["lane"] = lane
    if since is not None:
        params["cut"] = now - since
    rows = cur.all(queries.reads_settled_jobs(bool(lane), since is not None), params)
    return [dict(r, by_estimate=bool(r["by_estimate"])) for r in _dicts(_SETTLED, rows)]


def spend(cur: Cursor, now: float, *, lane: str | None, since: float | None) -> list[dict]:
    """Settlements (``lane, settled_at, actual``) in time order, within ``since`` seconds if given."""
    params: dict = {}
    if lane:
        params["lane"] = lane
    if since is not None:
        params["cut"] = now - since
    rows = cur.all(queries.reads_spend(bool(lane), since is not None), params)
    return _dicts(("lane", "settled_at", "actual"), rows)


def shadow_estimates(cur: Cursor, *, lane: str | None) -> list[dict]:
    if lane:
        rows = cur.all(queries.READS_SHADOW_ESTIMATES_OF_LANE, {"lane": lane})
    else:
        rows = cur.all(queries.READS_SHADOW_ESTIMATES, {})
    return _dicts(("job_id", "version", "est"), rows)


def estimator_samples(cur: Cursor, version: str, *, lane: str | None) -> list[dict]:
    params = {"v": version}
    if lane:
        params["lane"] = lane
    rows = cur.all(queries.reads_estimator_samples(bool(lane)), params)
    return _dicts(("stage", "est", "actual", "finished_at"), rows)


def history(cur: Cursor, since: float) -> list[dict]:
    rows = cur.all(
        queries.READS_HISTORY,
        {"since": since},
    )
    return _dicts(("created_at", "stage", "est", "actual", "run_key", "rate_cost", "tenant"), rows)


def query(cur: Cursor, sql: str, params: dict | None) -> tuple[list[str], list[tuple]]:
    """A caller's own query, in a transaction the database itself keeps read-only: a statement that
    would write is refused by PostgreSQL (``set transaction read only``) or SQLite (``query_only``).

    Nor may it change the session the ledger's own writes run on later (a read-only transaction still
    allows ``set_config(..., false)``, pragmas, a session advisory lock): on PostgreSQL it runs in a
    savepoint rolled back once its rows are read (settings made in it are undone) and the session's
    advisory locks are released; on SQLite the caller closes the connection afterwards
    (:meth:`lane_plugin.Ledger.rows`: pragmas and attached databases die with it).
    """
    sqlite = cur.dialect == "sqlite"
    cur.execute(queries.READS_QUERY_ONLY_ON if sqlite else queries.READS_READ_ONLY)
    if not sqlite:
        cur.execute(queries.READS_QUERY_SAVEPOINT)
    try:
        cur.execute(sql, params or {})
        cols = [d[0] for d in cur.raw.description or ()]
        return cols, [tuple(r) for r in cur.raw.fetchall()]
    except Exception as exc:
        if "readonly" in str(exc).lower() or "read-only" in str(exc).lower():
            raise InvalidInput("sql", sql, "Ledger.rows runs read-only queries; this statement writes") from None
        raise
    finally:
        if sqlite:
            cur.execute(queries.READS_QUERY_ONLY_OFF)
        else:
            _undo(cur, sql)


def _undo(cur: Cursor, sql: str) -> None:
    """PostgreSQL: undo what a caller's query did to the session (its savepoint rolled back, advisory locks released)."""
    try:
        cur.execute(queries.READS_ROLLBACK_QUERY)
        cur.execute(queries.READS_UNLOCK_ALL)
    except Exception:  # it ended the transaction or released the savepoint itself: refused, never retried
        raise InvalidInput(
            "sql",
            sql,
            "Ledger.rows runs one query in a read-only transaction; this statement "
            "ends the transaction or its savepoint",
        ) from None
