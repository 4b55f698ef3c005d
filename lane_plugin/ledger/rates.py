"""The sliding rate window: what the provider's rate limiter was charged in the last ``window_seconds``.

Every admission writes one ``rate_charge`` row ``(job, attempt, lane, at, cost)``
and adds ``cost`` to the lane's ``window_used``; a tick first prunes the rows at
or before ``now - window_seconds`` (an index range read on ``(lane, at)`` of only
the rows leaving the window) and subtracts them. So ``window_used`` is always
the sum of the lane's rows, the rate tokens admitted in ``(now - window_seconds,
now]`` once pruned, and the admission check ``window_used + rate_cost <=
burst_tokens`` is the sliding-window rule of :mod:`lane_plugin.policy`.

A charge is *pending* (``sent`` false) while its lease is handed to a waiter that has not picked it up
(a tick or hand-off leasing another process's gated job): its request has not gone out, but will, so the
slide never prunes it. The pick-up (:func:`stamp`, or PostgreSQL's watcher read,
:func:`lane_plugin.ledger.waiters.rows_sent`) moves it to that moment (+ the send slack) and marks it
sent: it then counts for a full window from when its request really goes out, however late. A lease that
ends unpicked (reaped, voided by a retry) drops its pending charge (:func:`drop_pending`: its request
never went out); a settlement of one marks it sent from the settlement (:func:`stamp`, ``pending_only``). A lease the tick
hands to its own caller (a job with no waiter, leased only by an explicit tick, or the ticking process's
own) is sent at the grant.

Room that frees by the window sliding has no event to tell a waiter (a settlement hands its room on,
a sliding window does not): a tick that leaves a job blocked by the burst window asks
:func:`free_at` when the window will hold room for it, and the waiters' watcher ticks the lane at
that moment (:mod:`lane_plugin.ledger.wakeups`), not at its next safety poll.

A lane whose provider counts the tokens really used (``rate_basis = 'actual'``)
has its charge trued up at settlement: the row's cost becomes the actual.
"""

from __future__ import annotations

from ..policy.window import window_expiry
from . import queries
from .db import Cursor
from .lanes import LaneRow


def slide(cur: Cursor, row: LaneRow, now: float) -> LaneRow:
    """Prune the charges that left the window (lane row locked); updates ``row`` in place."""
    cut = now - row.window_seconds
    if cut <= row.window_start or row.window_used == 0:
        return row  # never backwards (a clock read a moment earlier must not re-count); or nothing to prune
    if cur.dialect == "postgresql":  # one round trip
        row.window_used = cur.scalar(
            queries.RATES_SLIDE_WITH_RATE_CHARGE,
            {"l": row.name, "cut": cut},
        )
        row.window_start = cut
        return row
    gone = cur.all(queries.RATES_SLIDE_DELETE_RATE_CHARGE, {"l": row.name, "cut": cut})
    freed = sum(r[0] for r in gone)
    cur.execute(
        queries.RATES_SLIDE_UPDATE_LANE,
        {"f": freed, "cut": cut, "l": row.name},
    )
    row.window_used -= freed
    row.window_start = cut
    return row


def charge(cur: Cursor, lane: str, now: float, charges: list[tuple[str, int, int, bool]]) -> None:
    """Record ``(job_id, attempt, cost, sent)`` admitted now (the caller adds their sum to ``window_used``);
    ``sent`` false: pending until its waiter picks the lease up (SQLite; PostgreSQL's tick writes its own)."""
    cur.executemany(
        queries.RATES_CHARGE,
        [{"j": j, "a": a, "l": lane, "at": now, "c": c, "s": s} for j, a, c, s in charges],
    )


def true_up(cur: Cursor, job_id: str, attempt: int, actual: int) -> None:
    """Replace an attempt's charge by the tokens it really used, if it is still in the window and its lane's
    provider counts actual tokens (``rate_basis = 'actual'``).

    The charge's own lane, not the job's: a job whose lease expired may have moved to its fallback since,
    and its late settlement must true up the window that counted the attempt. The settling transaction holds
    the job's lane lock; another lane's charge is locked here (PostgreSQL), so a tick pruning it waits or has
    deleted it (then nothing is changed).
    """
    pg = cur.dialect == "postgresql"
    row = cur.one(
        queries.RATES_TRUE_UP_SELECT_RATE_CHARGE_FOR_UPDATE if pg else queries.RATES_TRUE_UP_SELECT_RATE_CHARGE,
        {"j": job_id, "a": attempt},
    )
    if row is None or row[0] == actual:
        return
    old, lane = row
    cur.execute(queries.RATES_TRUE_UP_UPDATE_RATE_CHARGE, {"c": actual, "j": job_id, "a": attempt})
    cur.execute(queries.RATES_TRUE_UP_UPDATE_LANE, {"d": actual - old, "l": lane})


# The gate's default send slack (LANE_SEND_SLACK_SECONDS unset): this long, but at most SLACK_SHARE of
# the lane's window: on a 60 s provider window the whole 0.5 s (0.8% of its rate), on the 1 s default
# window 0.05 s, not a third of the burst. A slack the user sets is used as it is.
DEFAULT_SLACK = 0.5
SLACK_SHARE = 0.05


def slack_for(send_slack: float | None, window_seconds: float) -> float:
    """The send slack of a charge in a lane with ``window_seconds``; ``None``: the default (:data:`DEFAULT_SLACK`,
    at most :data:`SLACK_SHARE` of the window).

    Example:
        >>> slack_for(None, 60.0), slack_for(None, 1.0), slack_for(0.5, 1.0), slack_for(0.0, 60.0)
        (0.5, 0.05, 0.5, 0.0)
    """
    return min(DEFAULT_SLACK, window_seconds * SLACK_SHARE) if send_slack is None else send_slack


def slack_sql(send_slack: float | None, window: str) -> tuple[str, dict]:
    """:func:`slack_for` as a SQL expression of the column ``window`` (PostgreSQL), with its parameters."""
    if send_slack is None:
        return queries.send_slack_share(window), {"slack": DEFAULT_SLACK, "share": SLACK_SHARE}
    return ":slack", {"slack": send_slack}


def stamp(cur: Cursor, job_id: str, attempt: int, now: float, *, pending_only: bool = False) -> None:
    """The holder picked its lease up now (a waiter polls; another process's tick may have admitted
    it seconds ago): the request goes out now, so its charge leaves the window ``window_seconds``
    from now, and is sent. Later only, never earlier. A pending charge is never pruned, so a pick-up
    however late finds it; a sent one already pruned (its request went out at the grant) stays pruned.

    ``pending_only``: a live settlement of an attempt whose lease was never picked up. Its request went
    out at some moment before now, unknown, so its charge is sent from now (cautious: a full window from
    the settlement); a charge already sent is left as it is. (PostgreSQL's one-statement settlement does
    this in its own statement.)
    """
    params = {"now": now, "j": job_id, "a": attempt, "t": True}
    cur.execute(queries.RATES_STAMP["rate_charge", pending_only], params)
    # the attempt's charges against the lane's other limits (lane_plugin.ledger.limits) move with it
    cur.execute(queries.RATES_STAMP["limit_charge", pending_only], params)


def drop_pending(cur: Cursor, job_ids: list[str]) -> None:
    """Leases of ``job_ids`` ended without a pick-up (reaped, voided): their pending charges leave the window
    (their requests never went out), and their lanes' ``window_used`` with them (the lanes are locked).

    The callers drop the limit charges too (:func:`lane_plugin.ledger.limits.drop_pending`)."""
    freed: dict[str, int] = {}
    for i in range(0, len(job_ids), 500):
        part = {f"j{k}": j for k, j in enumerate(job_ids[i : i + 500])}
        for lane, cost in cur.all(queries.rates_drop_pending(part), part):
            freed[lane] = freed.get(lane, 0) + cost
    for lane, cost in sorted(freed.items()):
        cur.execute(queries.RATES_DROP_PENDING_UPDATE_LANE, {"c": cost, "l": lane})


def stamp_sent(cur: Cursor, job_id: str, attempt: int, now: float, send_slack: float | None) -> None:
    """:func:`stamp` at ``now`` plus the send slack the job's lane allows (:func:`slack_for` of its window)."""
    if send_slack is None or send_slack > 0:
        window = cur.scalar(queries.RATES_STAMP_SENT, {"j": job_id})
        now += slack_for(send_slack, window or 0.0)
    stamp(cur, job_id, attempt, now)


def free_at(cur: Cursor, row: LaneRow, used: int, need: int) -> float | None:
    """The first ledger time at which the window holds at most ``burst_tokens - need`` (lane row locked).

    Args:
        cur: the admission transaction's cursor.
        row: the lane, its window slid to the tick's ``now``.
        used: the rate tokens in the window after this tick (``window_used`` plus what it admitted).
        need: the room a job blocked by the burst window needs (:attr:`lane_plugin.policy.Decision.burst_need`).

    Returns:
        When the oldest charges whose leaving makes that room leave (:func:`~lane_plugin.policy.window.window_expiry`,
        the instant :func:`slide` prunes them); None if the window has the room already or never will, or
        not before a pending charge is picked up (a pending charge never leaves on its own: a tick after the
        pick-up, the safety poll's, asks again).
    """
    excess = used + need - row.burst_tokens
    if excess <= 0 or need > row.burst_tokens:
        return None
    # The running sum of the lane's charges, oldest first: the first row that reaches the excess (its
    # ties share its time) is the last one that has to leave.
    at = cur.scalar(
        queries.RATES_FREE_AT,
        {"l": row.name, "x": excess},
    )
    return None if at is None else window_expiry(float(at), row.window_seconds)


def used(cur: Cursor, row: LaneRow, now: float) -> int:
    """Rate tokens admitted in ``(now - window_seconds, now]`` and pending ones, read without writing (status)."""
    return int(
        cur.scalar(
            queries.RATES_USED,
            {"l": row.name, "cut": now - row.window_seconds},
        )
    )
