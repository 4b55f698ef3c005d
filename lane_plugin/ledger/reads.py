"""What the reports, estimators and simulator read from the ledger, as typed queries.

Each function runs inside a read transaction the :class:`~lane_plugin.Ledger`
opens; nothing outside this package writes SQL.
"""

from __future__ import annotations

from ..errors import InvalidInput
from . import queries
from .db import Cursor
from .jobs import ALL_JOB_COLUMNS, get_job

_TAIL = ("job_id", "lane", "stage", "est", "reason", "parked_at", "deadline")
_SETTLED = ("id", "lane", "stage", "est", "est_version", "actual", "overage", "finished_at", "est_input",
            "by_estimate", "rate_cost")


def _dicts(keys: tuple[str, ...], rows) -> list[dict]:
    return [dict(zip(keys, r)) for r in rows]


def job(cur: Cursor, job_id: str) -> dict:
    get_job(cur, job_id)  # UnknownJob
    row = cur.one(queries.reads_job(ALL_JOB_COLUMNS), {"id": job_id})
    return dict(zip(ALL_JOB_COLUMNS, row))


def tail(cur: Cursor, now: float, lane: str | None) -> list[dict]:
    rows = cur.all(
        queries.reads_tail(_TAIL) + (" where lane = :l" if lane else "") + " order by parked_at, job_id",
        {"l": lane},
    )
    return [dict(zip(_TAIL, r), age=now - r[5]) for r in rows]


def settled_jobs(cur: Cursor, now: float, *, lane: str | None, since: float | None) -> list[dict]:
    where, params = ["j.state = 'done'"], {}
    if lane:
        where.append("j.lane = :lane")
        params["lane"] = lane
    if since is not None:
        where.append("j.finished_at >= :cut")
        params["cut"] = now - since
    rows = cur.all(
        queries.reads_settled_jobs(where),
        params,
    )
    return [dict(r, by_estimate=bool(r["by_estimate"])) for r in _dicts(_SETTLED, rows)]


def spend(cur: Cursor, now: float, *, lane: str | None, since: float | None) -> list[dict]:
    """Settlements (``lane, settled_at, actual``) in time order, within ``since`` seconds if given."""
    where, params = [], {}
    if lane:
        where.append("lane = :lane")
        params["lane"] = lane
    if since is not None:
        where.append("settled_at >= :cut")
        params["cut"] = now - since
    rows = cur.all(
        queries.READS_SPEND + (f" where {' and '.join(where)}" if where else "")
        + " order by settled_at, id",
        params,
    )
    return _dicts(("lane", "settled_at", "actual"), rows)


def shadow_estimates(cur: Cursor, *, lane: str | None) -> list[dict]:
    rows = cur.all(
        queries.READS_SHADOW_ESTIMATES + (" and j.lane = :lane" if lane else ""),
        {"lane": lane} if lane else {},
    )
    return _dicts(("job_id", "version", "est"), rows)


def estimator_samples(cur: Cursor, version: str, *, lane: str | None) -> list[dict]:
    params = {"v": version}
    where = ""
    if lane:
        where = " and j.lane = :lane"
        params["lane"] = lane
    # A job billed its estimate because no usage was found teaches nothing: its "actual" is a guess.
    where += " and not exists (select 1 from settlement x where x.job_id = j.id and x.by_estimate)"
    rows = cur.all(
        queries.READS_ESTIMATOR_SAMPLES
        + where
        + " union all select j.stage, s.est, j.actual, j.finished_at from job j join shadow_estimate s "
        "on s.job_id = j.id where j.state = 'done' and s.version = :v" + where,
        params,
    )
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
    cur.execute(queries.READS_QUERY_PRAGMA if sqlite else queries.READS_QUERY)
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
            cur.execute(queries.READS_QUERY_PRAGMA_2)
        else:
            _undo(cur, sql)


def _undo(cur: Cursor, sql: str) -> None:
    """PostgreSQL: undo what a caller's query did to the session (its savepoint rolled back, advisory locks released)."""
    try:
        cur.execute(queries.READS_UNDO_ROLLBACK)
        cur.execute(queries.READS_UNDO_SELECT)
    except Exception:  # it ended the transaction or released the savepoint itself: refused, never retried
        raise InvalidInput("sql", sql, "Ledger.rows runs one query in a read-only transaction; this statement "
                           "ends the transaction or its savepoint") from None  # fmt: skip
