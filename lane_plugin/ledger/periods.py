"""A lane's accounting period: when it starts, rolling its counters over, reading them as of a time, and switching
the period of a lane."""

from __future__ import annotations

import calendar
import copy
import time
from typing import Protocol, TypeVar

from . import queries
from .db import Cursor


class _Counted(Protocol):
    """What of a lane row (:class:`lane_plugin.ledger.lanes.LaneRow`) its period reads and rolls."""

    name: str
    period: str
    period_start: float
    spent: int
    overage: int


Row = TypeVar("Row", bound=_Counted)


def period_start(period: str, now: float) -> float:
    """Start (UTC) of the accounting period containing ``now``; 0 for no period."""
    if period == "none":
        return 0.0
    t = time.gmtime(now)
    if period == "daily":
        return float(calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0)))
    return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))


def roll_counters(cur: Cursor, row: Row, now: float) -> Row:
    """Start a new period when it has rolled over (row is locked); the rate window slides in rates.py."""
    ps = period_start(row.period, now)
    changes: dict = {}
    if row.period != "none" and ps > row.period_start:
        changes.update(period_start=ps, spent=0, overage=0)
    if changes:
        cur.execute(queries.lanes_roll_counters(changes), {**changes, "name": row.name})
        for k, v in changes.items():
            setattr(row, k, v)
    return row


def as_of(row: Row, now: float) -> Row:
    """The row as the next writer will see it at ``now``: a period that rolled over counts from zero
    (what :func:`roll_counters` will write), for reads that write nothing (status, a job's place)."""
    if row.period != "none" and period_start(row.period, now) > row.period_start:
        rolled = copy.copy(row)
        rolled.spent, rolled.overage, rolled.period_start = 0, 0, period_start(row.period, now)
        return rolled
    return row


def repoint_period(cur: Cursor, old: Row, period: str, now: float) -> None:
    """The period changed: the lane counts from the start of the new period containing ``now``, and
    ``spent``/``overage`` are what was settled since then, so a switch neither wipes what was spent
    in the current period nor keeps what an earlier one spent. Switching to no period keeps the
    current period's start (and its spend, once the old period has rolled): no reset comes after it.
    """
    name = old.name
    if period == "none":
        roll_counters(cur, old, now)
        return
    start = period_start(period, now)
    spent, overage = cur.one(
        queries.LANES_REPOINT_PERIOD_SELECT_SETTLEMENT,
        {"l": name, "p": start},
    )
    cur.execute(queries.LANES_REPOINT_PERIOD_UPDATE_LANE, {"p": start, "s": spent, "o": overage, "l": name})
