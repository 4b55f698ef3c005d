"""Waiters: who waits for a gated job, their heartbeat, the lane's tick try-lock and its wake-ups.

A *waiter* is one process waiting for gated jobs (``waiter`` row, ``job.waiter``); its watcher
thread (:mod:`lane_plugin.ledger.wakeups`) beats its heartbeat every :data:`HEARTBEAT_SECONDS`
while it waits. A waiter not seen for :data:`GONE_SECONDS`, or whose lease expired unrenewed, is
*gone*: its waiting jobs leave admission at once, parked with the reason ``waiter gone`` (never
leased to nobody again and again), and Prefect's own retry makes the next attempt. A job with no
waiter (submitted from the CLI, pulled by whoever ticks) keeps requeue-on-expiry.

The tick try-lock: one ticker at a time per lane (``pg_try_advisory_xact_lock`` on PostgreSQL; an
in-process lock and ``BEGIN IMMEDIATE`` with a short busy timeout on SQLite, see
:meth:`~lane_plugin.ledger.db.Database.transaction`); a tick that finds another running returns at
once. On PostgreSQL a transaction that leases jobs or frees room ``NOTIFY``s the lane's channel.
"""

from __future__ import annotations

import os
import socket
import uuid

from . import queries
from .db import Cursor
from .queries import ROW_KEYS as ROW_KEYS
from .rates import slack_sql

HEARTBEAT_SECONDS = 1.0  # a waiting process says it is still there this often
GONE_SECONDS = 5.0  # ... and is gone after this long unseen (five missed heartbeats)
WAITER_GONE = "waiter gone"
CHANNEL = "lane_plugin"  # the LISTEN/NOTIFY channel; the payload is "<schema>|<lane>|<what>"
NOTIFY_BYTES = 8000  # PostgreSQL refuses a NOTIFY payload this long or longer
_SCHEMA_BYTES = 63  # the longest schema name (NAMEDATALEN - 1): the payload's prefix, unknown until the server adds it
_PG_TICK_CLASS = 0x1A4E  # pg_try_advisory_xact_lock(class, hashtext(schema/lane))
_CHUNK = 500
RECHECK_SECONDS = 1.0  # a waiter seen alive is not read again for this long (ledger time)
_seen_alive: dict[tuple[int, str], float] = {}  # (the database, the waiter): ledger time seen alive
_idents: dict[int, str] = {}  # pid -> waiter id (a fork is another waiter)


def waiter_id() -> str:
    """This process's waiter id (``host:pid:random``): a fork is a new waiter."""
    pid = os.getpid()
    got = _idents.get(pid)
    if got is None:  # one C call decides between threads: no lock an interrupted thread could keep
        got = _idents.setdefault(pid, f"{socket.gethostname()[:32]}:{pid}:{uuid.uuid4().hex[:12]}")
    return got


def claim(cur: Cursor, job_id: str, waiter: str, now: float) -> None:
    """A gated intake: ``waiter`` waits for ``job_id`` (heartbeat now; the waiting job names it)."""
    heartbeat(cur, waiter, now)
    cur.execute(queries.WAITERS_CLAIM, {"w": waiter, "id": job_id})


def heartbeat(cur: Cursor, waiter: str, now: float) -> None:
    """The waiter is still there (and no longer gone, if it was wrongly thought so)."""
    cur.execute(queries.WAITERS_HEARTBEAT_UPDATE_WAITER, {"now": now, "w": waiter})
    if cur.rowcount != 1:
        cur.execute(queries.WAITERS_HEARTBEAT_INSERT_WAITER, {"w": waiter, "now": now})


def gone(cur: Cursor, waiters: set[str], now: float) -> set[str]:
    """Of ``waiters``, those gone: marked gone before, or not seen for :data:`GONE_SECONDS`.

    A waiter this process saw alive less than :data:`RECHECK_SECONDS` ago (ledger time) is not read
    again: the lane's lock is held, and one round trip per tick adds up.
    """
    out: set[str] = set()
    ids = sorted(w for w in waiters if not 0 <= now - _seen_alive.get((id(cur.stats), w), -1e18) < RECHECK_SECONDS)
    for i in range(0, len(ids), _CHUNK):
        part = {f"w{k}": w for k, w in enumerate(ids[i : i + _CHUNK])}
        rows = cur.all(queries.waiters_gone(part), part)
        for w, seen, gone_at in rows:
            if gone_at is not None or now - seen > GONE_SECONDS:
                out.add(w)
            elif len(_seen_alive) < 100_000:
                _seen_alive[(id(cur.stats), w)] = now
    return out


def rows(cur: Cursor, job_ids: list[str]) -> list[tuple]:
    """Waiting jobs' own rows (primary-key lookups, no lock): has anyone handed them a lease?"""
    out: list[tuple] = []
    for i in range(0, len(job_ids), _CHUNK):
        part = {f"j{k}": j for k, j in enumerate(job_ids[i : i + _CHUNK])}
        out += cur.all(queries.waiters_rows(part), part)
    return out


def rows_sent(cur: Cursor, job_ids: list[str], now: float, send_slack: float | None) -> list[tuple]:
    """PostgreSQL: :func:`rows`, and in the same statement the leased ones' requests go out now.

    The watcher reads its waiting jobs' rows the moment another process's commit tells it they may have
    been leased; the waiter it wakes starts its body within milliseconds. So the read stamps their rate
    charges as :func:`lane_plugin.ledger.rates.stamp_sent` would (``now`` plus the lane's send slack,
    later only, and sent: a pending charge counts from its pick-up): the woken waiter does not run a write
    transaction of its own before its body starts. A charge is moved later only, so a stamp for a job whose
    waiter then gives up is merely cautious.
    """
    slack, params = slack_sql(send_slack, "l.window_seconds")
    out: list[tuple] = []
    for i in range(0, len(job_ids), _CHUNK):
        part = {f"j{k}": j for k, j in enumerate(job_ids[i : i + _CHUNK])}
        out += cur.all(queries.waiters_rows_sent(part, slack), {**part, "now": now, **params})
    return out


def lease_expired(cur: Cursor, now: float) -> bool:
    """Is any lease past its expiry (the head of ``ix_job_lease``)? Cheap: then reap hands its room on."""
    return cur.one(queries.WAITERS_LEASE_EXPIRED, {"now": now}) is not None


def try_tick_lock(cur: Cursor, lane: str) -> bool:
    """PostgreSQL: this transaction becomes the lane's one ticker, or returns False at once.

    (On SQLite the transaction's ``BEGIN IMMEDIATE`` with a short busy timeout is the try-lock.)
    """
    if cur.dialect != "postgresql":
        return True
    return bool(cur.scalar(queries.WAITERS_TRY_TICK_LOCK, {"c": _PG_TICK_CLASS, "l": lane}))


def leased_what(lane: str, job_ids: list[str]) -> str:
    """The ``what`` of the NOTIFY a commit that leased ``job_ids`` sends: ``leased:<id>,<id>,...``.

    A listening process wakes exactly the waiters of those ids it holds, reading only their rows (and
    none at all when it holds none of them). Plain ``leased``, the payload of older versions (every
    listener reads all its waiting rows), when the list would pass PostgreSQL's payload limit
    (:data:`NOTIFY_BYTES`) or an id has a separator in it; an older listener reads all its waiting rows
    on either form.
    """
    what = "leased:" + ",".join(job_ids)
    if not job_ids or any("," in j or "|" in j for j in job_ids):
        return "leased"
    if _SCHEMA_BYTES + len(lane.encode()) + len(what.encode()) + 2 >= NOTIFY_BYTES:
        return "leased"
    return what


def parse_what(rest: str) -> tuple[str, str, frozenset[str] | None]:
    """A payload's ``<lane>|<what>`` (its schema taken off): ``(lane, kind, ids)``; ``ids`` None when the
    payload names none (``room``; ``leased`` from an older version or past the payload limit)."""
    lane, _, what = rest.rpartition("|")
    kind, sep, ids = what.partition(":")
    return lane, kind, (frozenset(ids.split(",")) if sep and ids else None)


def notify(cur: Cursor, lane: str, what: str) -> None:
    """PostgreSQL: tell every listening process, at commit, that jobs were ``leased`` or ``room`` freed."""
    if cur.dialect == "postgresql":
        cur.execute(queries.WAITERS_NOTIFY, {"ch": CHANNEL, "l": lane, "w": what})


__all__ = [
    "CHANNEL",
    "GONE_SECONDS",
    "HEARTBEAT_SECONDS",
    "NOTIFY_BYTES",
    "ROW_KEYS",
    "WAITER_GONE",
    "claim",
    "gone",
    "heartbeat",
    "lease_expired",
    "leased_what",
    "notify",
    "parse_what",
    "rows",
    "rows_sent",
    "try_tick_lock",
    "waiter_id",
]
