"""How far ahead a lease may end: never more than its lane's ``lease_seconds`` past now.

``lease_until`` is absolute, on the ledger's clock (the database server's on PostgreSQL, the machine's
on SQLite), and every grant and renewal sets it to ``now + lease_seconds``. So a lease ending further
ahead than that was set on a clock that has since gone back: NTP stepping a fast clock back, a VM
restored from a snapshot, an operator's correction. Left alone, a dead holder's lease would then live
until the old clock's reading came round again (a day, for a clock a day fast), holding its estimate
in ``reserved`` and a ``max_leased`` slot, with nothing to see.

The bound needs no new column: the reap pulls such a lease back to ``now + lease_seconds`` (it expires
on elapsed time from there), a waiting process's watcher notices one within a second (one index read,
:func:`out_of_bounds`) and reaps, and ``lane audit`` names it. A live holder is unharmed: it renews every
third of its lease time, and a renewal sets the lease from the corrected clock anyway.

Example:
    >>> bound(cur, "free", 90.0, now=now)       # inside the reap's transaction       # doctest: +SKIP
    ['4f2a...']
"""

from __future__ import annotations

from . import queries
from .db import Cursor

#: How far past ``now + lease_seconds`` a lease may end before it counts as set on a clock that went back:
#: workers read the database server's clock each with its own small error (``db.DatabaseClock``), so a
#: renewal can land a moment ahead of another worker's now. A step back smaller than this is not worth a write.
SKEW_SECONDS = 5.0


def bound(cur: Cursor, lane: str, lease_seconds: float, *, now: float) -> list[str]:
    """Pull the leases of ``lane`` that end past ``now + lease_seconds`` back to it; returns their job ids."""
    rows = cur.all(
        queries.LEASES_BOUND,
        {"until": now + lease_seconds, "far": now + lease_seconds + SKEW_SECONDS, "l": lane},
    )
    return [r[0] for r in rows]


def out_of_bounds(cur: Cursor, now: float) -> bool:
    """Does any lease end further ahead than the longest ``lease_seconds`` of any lane allows (the top of
    ``ix_job_lease``)? Exact when the lanes share one lease length; a lane with a shorter one is bounded
    by its reap (the scheduled one, or the next one a lease expiring sets off)."""
    longest = cur.scalar(queries.LEASES_OUT_OF_BOUNDS_SELECT_LANE)
    if longest is None:
        return False
    far = now + float(longest) + SKEW_SECONDS
    return cur.one(queries.LEASES_OUT_OF_BOUNDS_SELECT_JOB, {"far": far}) is not None


def too_far_ahead(cur: Cursor, now: float, limit: int = 20) -> list[tuple[str, str, float, float]]:
    """``(job id, lane, seconds its lease still runs, the lane's lease_seconds)`` of leases ending too far ahead."""
    rows = cur.all(
        queries.leases_too_far_ahead(limit),
        {"now": now, "skew": SKEW_SECONDS},
    )
    return [(r[0], r[1], float(r[2]) - now, float(r[3])) for r in rows]


__all__ = ["SKEW_SECONDS", "bound", "out_of_bounds", "too_far_ahead"]
