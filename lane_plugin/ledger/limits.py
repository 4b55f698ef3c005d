"""A lane's limits over requests, input and output tokens, and the provider's pause, in the ledger.

Each limit (:mod:`lane_plugin.policy.limits`) keeps its window as :mod:`.rates` keeps the ``tokens`` one:
every admission writes one ``limit_charge`` row per limit ``(job, attempt, unit, lane, at, cost)`` and
adds ``cost`` to the limit's ``lane_limit.used``; a tick first prunes the rows at or before ``now -
window_seconds`` of that limit (an index range read on ``(lane, unit, at)`` of only the rows leaving)
and subtracts them. A pending charge (a lease handed to a waiter that has not picked it up) is never
pruned, and the pick-up moves it to the moment its request goes out, as the ``tokens`` charge.

Which limits a lane has is on its row (``lane.limit_spec``): a lane without any reads no ``lane_limit``
row at admission. ``output_tokens`` is charged the job's output allowance and trued up to what was
generated at settlement (:func:`true_up_output`).

A provider's 429 (:mod:`lane_plugin.gating.ratelimits`) closes the lane for every process: :func:`pause`
writes ``lane.paused_until`` in one transaction; admission leases nothing before it (rule 1b), and the
waiters' watcher ticks the lane at that moment (:mod:`.wakeups`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping

from ..errors import InvalidInput, UnknownJob
from ..policy.limits import NO_TOKENS_LIMIT, OUTPUT_TOKENS, TOKENS, Limit, LimitUse, format_limit, spec_of
from ..policy.window import window_expiry
from . import queries, rates, waiters
from .db import Cursor
from .lanes import LaneRow, lock_lane


def slide(cur: Cursor, row: LaneRow, now: float) -> tuple[LimitUse, ...]:
    """Prune every limit's charges that left its window (lane row locked); the limits with what they hold."""
    if not row.limit_spec:
        return ()
    stated = dict(row.limits)
    out = []
    for unit, _amount, window, used, start in cur.all(queries.LIMITS_SLIDE_SELECT_LANE_LIMIT, {"l": row.name}):
        if unit not in stated:
            continue
        cut = now - window
        if cut > start and used:
            gone = cur.all(queries.LIMITS_SLIDE_DELETE_LIMIT_CHARGE, {"l": row.name, "u": unit, "cut": cut})
            freed = sum(r[0] for r in gone)
            cur.execute(queries.LIMITS_SLIDE_UPDATE_LANE_LIMIT, {"f": freed, "cut": cut, "l": row.name, "u": unit})
            used -= freed
        out.append(LimitUse(unit, stated[unit], int(used)))
    order = {u: i for i, (u, _) in enumerate(row.limits)}
    return tuple(sorted(out, key=lambda u: order[u.unit]))


def charge(
    cur: Cursor,
    lane: str,
    at: float,
    charges: list[tuple[str, int, Mapping[str, int], bool]],
    totals: Iterable[tuple[str, int]],
) -> None:
    """Record ``(job_id, attempt, units, sent)`` admitted now against each limit, and add ``totals`` to them."""
    totals = [(u, n) for u, n in totals]
    rows = [
        {"j": j, "a": a, "u": u, "l": lane, "at": at, "c": units[u], "s": s}
        for j, a, units, s in charges
        for u, _ in totals
    ]
    if rows:
        cur.executemany(queries.LIMITS_CHARGE_INSERT_LIMIT_CHARGE, rows)
    for unit, n in totals:
        if n:
            cur.execute(queries.LIMITS_CHARGE_UPDATE_LANE_LIMIT, {"n": n, "l": lane, "u": unit})


def stamp(cur: Cursor, job_id: str, attempt: int, now: float, *, pending_only: bool = False) -> None:
    """:func:`lane_plugin.ledger.rates.stamp` for the attempt's limit charges."""
    cur.execute(queries.RATES_STAMP["limit_charge", pending_only], {"now": now, "j": job_id, "a": attempt, "t": True})


def drop_pending(cur: Cursor, job_ids: list[str]) -> None:
    """:func:`lane_plugin.ledger.rates.drop_pending` for the limit charges (their lanes are locked)."""
    freed: dict[tuple[str, str], int] = {}
    for i in range(0, len(job_ids), 500):
        part = {f"j{k}": j for k, j in enumerate(job_ids[i : i + 500])}
        for lane, unit, cost in cur.all(queries.limits_drop_pending(part), part):
            freed[(lane, unit)] = freed.get((lane, unit), 0) + cost
    for (lane, unit), cost in sorted(freed.items()):
        cur.execute(queries.LIMITS_DROP_PENDING_UPDATE_LANE_LIMIT, {"c": cost, "l": lane, "u": unit})


def true_up_output(
    cur: Cursor,
    job_id: str,
    attempt: int,
    actual: int,
    now: float,
    *,
    lane: str | None = None,
    output: int | None = None,
) -> None:
    """The attempt's ``output_tokens`` charge becomes what it generated, counted from ``now`` (the settlement:
    the provider counts output as it is generated, so until a window after the call).

    ``lane``: the lane whose provider ran the call (its request went out). When the allowance charged at the
    admission has already left the window (a call longer than the window, or a lease lost and settled late
    after its call), the output is charged to that lane again from ``now``: the provider counts it all the
    same. A settlement long after its call holds the window a window longer than the provider does: the
    cautious side. None: the request never went out, nothing was generated.

    What it generated: ``output`` where the caller knows it (the gate, from the responses' usage), else
    ``actual - rate_input`` (the job's input units; 0 where unknown, so cautious), which reads prompt-cache
    tokens billed at a fraction of the input as less output.
    """
    r = cur.one(
        queries.LIMITS_TRUE_UP_OUTPUT_SELECT_LIMIT_CHARGE,
        {"j": job_id, "a": attempt, "u": OUTPUT_TOKENS},
    )
    if r is None:
        if lane is not None:
            _recharge_output(cur, job_id, attempt, actual, now, lane, output)
        return
    old, charged_lane, rate_input = r
    new = _generated(actual, rate_input, output)
    cur.execute(
        queries.LIMITS_TRUE_UP_OUTPUT_UPDATE_LIMIT_CHARGE,
        {"c": new, "now": now, "j": job_id, "a": attempt, "u": OUTPUT_TOKENS},
    )
    if new == old:
        return
    cur.execute(
        queries.LIMITS_TRUE_UP_OUTPUT_UPDATE_LANE_LIMIT, {"d": new - old, "l": charged_lane, "u": OUTPUT_TOKENS}
    )


def _generated(actual: int, rate_input: int, output: int | None) -> int:
    """What a call generated: ``output`` where the caller says, else what it billed beyond its input."""
    return max(0, int(actual) - int(rate_input)) if output is None else output


def _recharge_output(
    cur: Cursor, job_id: str, attempt: int, actual: int, now: float, lane: str, output: int | None
) -> None:
    """:func:`true_up_output` of a call whose charge left the window before it settled: a new charge from now,
    if ``lane`` limits output."""
    r = cur.one(queries.LIMITS_RECHARGE_OUTPUT_SELECT, {"j": job_id, "l": lane, "u": OUTPUT_TOKENS})
    if r is None:
        return
    new = _generated(actual, r[0], output)
    if new:
        charge(cur, lane, now, [(job_id, attempt, {OUTPUT_TOKENS: new}, True)], [(OUTPUT_TOKENS, new)])


def free_at(cur: Cursor, lane: str, use: LimitUse, used: int, need: int) -> float | None:
    """The first ledger time at which the limit's window holds at most ``amount - need``
    (:func:`lane_plugin.ledger.rates.free_at` for one limit); None: it has the room or never will."""
    excess = used + need - use.limit.amount
    if excess <= 0 or need > use.limit.amount:
        return None
    at = cur.scalar(
        queries.LIMITS_FREE_AT,
        {"l": lane, "u": use.unit, "x": excess},
    )
    return None if at is None else window_expiry(float(at), use.limit.window_seconds)


def set_limits(cur: Cursor, now: float, name: str, changes: Mapping[str, Limit | None]) -> LaneRow:
    """Set or drop (None) limits of lane ``name`` (locked here). ``tokens`` is the burst window
    (``burst_tokens`` / ``window_seconds``; dropped: no rate cost reaches it); the others are
    ``lane_limit`` rows, their windows kept when only the amount changes and emptied when dropped."""
    row = lock_lane(cur, name)
    current = dict(row.limits)
    for unit, lim in changes.items():
        if unit == TOKENS:
            burst, window = (NO_TOKENS_LIMIT, row.window_seconds) if lim is None else (lim.amount, lim.window_seconds)
            cur.execute(queries.LIMITS_SET_BURST, {"b": burst, "w": window, "now": now, "n": name})
        elif lim is None:
            current.pop(unit, None)
            cur.execute(queries.LIMITS_SET_LIMITS_DELETE_LIMIT_CHARGE, {"l": name, "u": unit})
            cur.execute(queries.LIMITS_SET_LIMITS_DELETE_LANE_LIMIT, {"l": name, "u": unit})
        else:
            current[unit] = lim
            cur.execute(
                queries.LIMITS_SET_LIMITS_UPDATE_LANE_LIMIT,
                {"a": lim.amount, "w": lim.window_seconds, "l": name, "u": unit},
            )
            if cur.rowcount != 1:
                cur.execute(
                    queries.LIMITS_SET_LIMITS_INSERT_LANE_LIMIT,
                    {"l": name, "u": unit, "a": lim.amount, "w": lim.window_seconds, "now": now},
                )
    cur.execute(queries.LIMITS_SET_SPEC, {"s": spec_of(current.items()), "now": now, "n": name})
    return lock_lane(cur, name)


def pause(cur: Cursor, lane: str, *, until: float, reason: str, now: float, job_id: str | None = None) -> float:
    """Close ``lane`` until ``until`` for every process (a provider's 429); returns when it reopens.

    A later pause than the one in force replaces it; an earlier one changes nothing (the provider's
    longest word wins). ``job_id``: the job whose attempt met the 429 (its ``rate_limited`` counts it); a job
    the ledger does not have is UnknownJob, and nothing is written.
    """
    if until <= now:
        raise InvalidInput("paused_until", until, f"must be after now ({now})")
    row = lock_lane(cur, lane)
    if job_id is not None:
        cur.execute(queries.LIMITS_PAUSE_UPDATE_JOB, {"id": job_id})
        if cur.rowcount != 1:  # raised in the transaction: it rolls back, as every call with an unknown job
            raise UnknownJob(job_id)
    if row.paused_until is not None and row.paused_until >= until:
        return row.paused_until
    cur.execute(queries.LIMITS_PAUSE_UPDATE_LANE, {"u": until, "r": reason, "now": now, "l": lane})
    # Every listening process ticks the lane at commit (PostgreSQL): the tick finds it paused and wakes it
    # at the reopen, and no one ticking in between leases into the closed window.
    waiters.notify(cur, lane, "room")
    return until


def true_up_remaining(
    cur: Cursor, lane: str, unit: str, provider_used: int, now: float, job_id: str | None = None, refused: bool = False
) -> None:
    """The provider says ``provider_used`` units of its limit are spent (its limit less what remains), counted
    when the request of ``job_id`` reached it (None: now; ``refused``: the count on its 429, which did not
    count the request itself): the lane's window holds the spend outside the lane that count shows, plus a
    margin for the outside spend to come, as one charge dated ``now``.

    Outside spend: the count less what the lane itself had sent in the window by the counted request's send
    (the lane's charges dated at or before it; those sent later are not in the count yet, and counting them
    would read the lane's own requests in flight as outside spend gone), and within a window before it: the
    charge of a request answered quickly is dated after its answer (the send slack), and the lane's window at
    the answer then still holds its own oldest requests that the provider's window at the arrival had let go;
    compared with them the count showed less outside spend than there was, by as much as a batch the lane
    sent together a window before (after a pause, or as its work thins out near the end of a run). It is kept as one charge per limit
    whose job id names the source (``provider:LANE``), re-dated and re-sized at every count: a key shared
    with another client stays shared, so the outside spend a count shows is expected to hold the window for a
    window after it (dated at the first count only, it would leave the window while the other client keeps
    spending, and a lane waiting on its own window would then admit a burst into a full one). A lower count
    lowers it (the other client slowed down), but no faster than the charge it replaces would have left the
    window (its cost times the share of the window still ahead of it): counts come back out of order (a long
    answer's count is older than a short one's after it), and the lane's requests sent together are ordered
    only roughly against the counted one, so one low reading must not empty the window. The *margin*: the
    outside spend expected before the next count (the outside spend divided by the counts a window brings: one
    per response of the lane's own requests in it, at least one). ``tokens``: the burst window's
    ``rate_charge``; the others: ``limit_charge``. The window is slid to ``now`` first, so a charge that left
    the provider's window does not hide outside spend.
    """
    row = lock_lane(cur, lane)
    if unit == TOKENS:
        row = rates.slide(cur, row, now)
        amount, window = row.burst_tokens, row.window_seconds
        params = {"l": lane}
    else:
        use = next((u for u in slide(cur, row, now) if u.unit == unit), None)
        if use is None:
            return
        amount, window = use.limit.amount, use.limit.window_seconds
        params = {"l": lane, "u": unit}
    if amount >= NO_TOKENS_LIMIT:
        return
    sql = queries.LIMITS_TRUE_UP[unit == TOKENS]
    as_of = None
    if job_id is not None:
        as_of = cur.scalar(sql["last_sent"], {"j": job_id, "u": unit})
    as_of = now if as_of is None else float(as_of)
    own_sent, own_n = cur.one(
        sql["own_sent"], {**params, "asof": as_of, "lo": as_of - window, "r": job_id if refused else ""}
    )
    outside = max(0, int(provider_used) - int(own_sent))
    lump = outside + -(-outside // max(int(own_n), 1))
    source = f"provider:{lane}"
    key = {**params, "j": source}
    held = cur.one(sql["held"], key)
    old = 0 if held is None else int(held[0])
    if old:  # a lower count lowers it over a window, not at once (see above)
        lump = max(lump, math.ceil(old * min(1.0, max(0.0, 1.0 - (now - float(held[1])) / window))))
    if lump == old and old == 0:
        return
    if held is not None:
        cur.execute(sql["rehold"], {**key, "c": lump, "at": now})
    else:
        cur.execute(sql["hold"], {**key, "at": now, "c": lump, "s": True})
    cur.execute(sql["count"], {**params, "c": lump - old})


def _clock(t: float) -> str:
    """A ledger time as people read it in ``lane status``: ``12:03:41`` (UTC)."""
    return time.strftime("%H:%M:%S", time.gmtime(t))


def limit_status(cur: Cursor, row: LaneRow, now: float) -> list[dict]:
    """Each of the lane's limits (``tokens`` first) with what its window holds at ``now`` and, when it is full
    (no room for one more unit), when it next has room: read without writing (status)."""
    out = []
    for unit, lim in row.policy.all_limits:
        if unit == TOKENS:
            held = rates.used(cur, row, now)
        else:
            held = int(
                cur.scalar(
                    queries.LIMITS_LIMIT_STATUS_SELECT_LIMIT_CHARGE,
                    {"l": row.name, "u": unit, "cut": now - lim.window_seconds},
                )
            )
        until = None
        if held >= lim.amount:
            at = cur.scalar(
                queries.LIMITS_FREED_AT_TOKENS if unit == TOKENS else queries.LIMITS_FREED_AT,
                {"l": row.name, "u": unit, "cut": now - lim.window_seconds, "x": held - lim.amount + 1},
            )
            until = None if at is None else window_expiry(float(at), lim.window_seconds)
        out.append(
            {
                "unit": unit,
                "amount": lim.amount,
                "window_seconds": lim.window_seconds,
                "used": held,
                "limit": format_limit((unit, lim)),
                "full_until": until,
            }
        )
    return out


def held_back(row: LaneRow, uses: list[dict], now: float) -> str | None:
    """What holds the lane back, in words: the provider's pause, else the full limits (with when each has room).

    Example:
        >>> held_back(type("R", (), {"paused_until": None})(), [{"limit": "requests 500/60s", "used": 500, "amount": 500,
        ...           "full_until": 0.0}], 0)
        'requests 500/60s full until 00:00:00'
    """
    if row.paused_until is not None and row.paused_until > now:
        return f"paused by the provider until {_clock(row.paused_until)}" + (
            f" after {row.paused_reason}" if row.paused_reason else ""
        )
    full = [
        f"{u['limit']} full until {_clock(u['full_until'])}" if u["full_until"] is not None else f"{u['limit']} full"
        for u in uses
        if u["used"] >= u["amount"]
    ]
    return "; ".join(full) or None
