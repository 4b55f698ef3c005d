"""Settlement: bill what one attempt really spent, exactly once (TigerBeetle's *post*)."""

from __future__ import annotations

import time

from ..errors import AmbiguousAttempt, ConflictingReplay, JobParked, NotLeased, Replay
from ..policy.limits import OUTPUT_TOKENS
from . import queries, tenants
from .db import Cursor
from .jobs import Settled, get_job, lock_job, ran_in
from .lanes import RETURNING, LaneRow, lock_lane, row_of
from .limits import drop_pending as drop_limit_pending
from .limits import true_up_output
from .periods import period_start, roll_counters
from .rates import drop_pending, stamp, true_up


def _limits_output(row: LaneRow) -> bool:
    """Does the lane limit ``output_tokens`` (its charges are trued up to what was generated)?"""
    return OUTPUT_TOKENS in dict(row.limits)


# The common case in one statement (PostgreSQL), the lane's lock included: the attempt named is the
# job's live lease. ``lk`` locks the lane row first (an uncorrelated EXISTS is a one-time filter,
# evaluated before the job is touched: the lock order stays lane, then job), and only if its period
# needs no roll; the job's UPDATE re-checks state, attempt and lane on the row's latest version; the
# settlement row and the lane's counters (the latest version, read after the lock) follow from what it
# returned. No row from ``j``: not the live lease (late, parked, moved to another lane, never leased)
# or a period to roll: the full path decides, under the lane lock.
_SQL = queries.settlement_lane_updates(RETURNING)
_LIVE_SQL = _SQL["live_pg"]


def settle(
    cur: Cursor,
    job_id: str,
    *,
    actual: int,
    attempt: int | None,
    outcome: str,
    now: float,
    by_estimate: bool = False,
    unsent: bool = False,
    output: int | None = None,
) -> tuple[Settled, LaneRow]:
    """Bill what one attempt really spent, exactly once (raises :class:`Replay` if already).

    ``by_estimate`` marks an attempt billed its estimate because no usage was found. ``unsent``: the
    live lease was never picked up, so its request never went out: a pending rate charge is dropped.
    ``output``: the output tokens the call generated, if the caller knows them (:func:`true_up_output`).
    Returns the settlement and the lane's row after it (still locked: the hand-off starts from it).

    Everything is decided under the lane lock on a fresh read of the job and its
    settlements: which attempt a bare job id means, replay or conflict, live or late.
    """
    if cur.dialect == "postgresql" and attempt is not None and not unsent:
        done = _settle_live(
            cur,
            job_id,
            actual=actual,
            attempt=attempt,
            outcome=outcome,
            now=now,
            by_estimate=by_estimate,
            output=output,
        )
        if done is not None:
            return done
    # Locks in the order lane, then job, as every writer does; and rolls the period first: a
    # settlement arriving after a period boundary but before the next tick must count in the new
    # period, not be wiped by that tick's reset.
    if cur.dialect == "postgresql":
        _lock_lanes_left(cur, job_id)
    lane_row, job = lock_job(cur, job_id)
    done = dict(cur.all(queries.SETTLEMENT_SETTLE_SELECT_SETTLEMENT, {"j": job_id}))
    if attempt is None:
        attempt = which_attempt(job, done)
    if attempt in done:
        raise Replay(attempt=attempt)  # the caller compares the actual with the first result's
    if attempt > job["lease_attempt"] or attempt < 1:
        if job["state"] == "parked":
            raise JobParked(
                f"job {job_id} is parked and was never leased for attempt {attempt}: nothing to settle "
                "(requeue it with lane tail requeue, or drop it)",
                job_id=job_id,
            )
        raise NotLeased(
            f"job {job_id} attempt {attempt} was never leased (state {job['state']}, "
            f"last leased attempt {job['lease_attempt'] or 'none'})",
            job_id=job_id,
        )
    lane_row = roll_counters(cur, lane_row, now)
    final = "done" if outcome == "done" else "failed"
    cur.execute(
        queries.SETTLEMENT_SETTLE_UPDATE_JOB,
        {"st": final, "a": actual, "now": now, "id": job_id, "att": attempt},
    )
    live = cur.rowcount == 1
    if live and unsent:  # never picked up, and the caller knows its request never went out
        drop_pending(cur, [job_id])
        drop_limit_pending(cur, [job_id])  # (a live lease is the job's only one: any pending charge is this attempt's)
    elif live:  # a lease settled without a pick-up: its request went out before now
        stamp(cur, job_id, attempt, now, pending_only=True)
    # A late attempt is billed to the lane it was leased in, which the job may have left since (for its
    # fallback): that lane's provider billed it. In that lane's period as it is now, as any late settlement.
    lane = job["lane"] if live else _billed_lane(cur, job_id, attempt, lane_row, now)
    est = job["est"]
    overage = max(0, actual - est) if live else actual
    cur.execute(
        queries.SETTLEMENT_SETTLE_INSERT_SETTLEMENT,
        {
            "j": job_id,
            "att": attempt,
            "l": lane,
            "e": est if live else 0,
            "a": actual,
            "o": overage,
            "late": not live,
            "be": bool(by_estimate),
            "out": outcome,
            "now": now,
        },
    )
    if cur.rowcount != 1:
        raise Replay(attempt=attempt)  # a concurrent settle of the same attempt won; roll back ours
    if lane_row.rate_basis == "actual" or not live:  # the provider counted what was really used: so does the
        true_up(cur, job_id, attempt, actual)  # window (a late attempt's charge may be in the lane it moved from)
    tenants.settle(cur, lane, job["tenant"], actual=actual, est=est if live else 0, now=now)
    if _limits_output(lane_row) or not live:  # output_tokens counted as generated (lane_plugin.ledger.limits)
        true_up_output(cur, job_id, attempt, actual, now, lane=None if unsent else lane, output=output)
    if live:
        after = cur.one(
            _SQL["live"],
            {"a": actual, "e": est, "v": job["est_var"], "o": overage, "now": now, "l": lane},
        )
    else:
        cur.execute(queries.SETTLEMENT_LATE_ACTUAL, {"a": actual, "id": job_id})
        after = cur.one(
            _SQL["late"],
            {"a": actual, "o": overage, "now": now, "l": lane},
        )
    settled = Settled(
        job_id, attempt, lane, est if live else 0, actual, overage, not live, outcome, by_estimate=bool(by_estimate)
    )
    return settled, row_of(after)


def _settle_live(
    cur: Cursor,
    job_id: str,
    *,
    actual: int,
    attempt: int,
    outcome: str,
    now: float,
    by_estimate: bool,
    output: int | None = None,
) -> tuple[Settled, LaneRow] | None:
    """PostgreSQL: settle the job's live lease in one statement under the lane lock; None if the
    attempt is not the live lease (the full path then decides, under the same lock)."""
    # Which lane to lock, and whether its period must roll first: read before the lock, re-checked by the
    # statement (a period only rolls forwards: if it needs no roll now, the locked row needs none either).
    # Not the live lease when read (late, replayed): the full path, before any lock is taken here, so that it
    # locks a lane the job left (a late settlement bills it) in name order with the job's lane.
    pre = cur.one(queries.SETTLEMENT_SETTLE_LIVE, {"id": job_id, "att": attempt})
    if pre is None or not pre[3]:
        return None
    lane, period, started, _ = pre
    ps = period_start(period, now)
    if ps > started:
        return None
    final = "done" if outcome == "done" else "failed"
    t0 = time.perf_counter()
    got = cur.one(
        _LIVE_SQL,
        {
            "st": final,
            "a": actual,
            "now": now,
            "id": job_id,
            "l": lane,
            "att": attempt,
            "be": bool(by_estimate),
            "out": outcome,
            "per": period,
            "ps": ps,
            "pd": period_start("daily", now),
            "pm": period_start("monthly", now),
        },
    )
    if got[0] and cur.locked_at is None:  # this statement waited for the lane's lock: a lock-wait sample
        cur.locked_at = time.perf_counter()
        if cur.stats is not None:
            cur.stats.lock_waits.append(cur.locked_at - t0)
    if got[1] == 0:
        return None
    if got[2] is None:
        raise Replay(attempt=attempt)  # already settled (the job was reopened since): roll back the job's update
    est, overage = got[2], got[3]
    after = row_of(got[4:])
    if after.rate_basis == "actual":  # the provider counted what was really used: so does the window
        true_up(cur, job_id, attempt, actual)
        after = lock_lane(cur, lane)  # (held already: a fresh read of the window)
    if _limits_output(after):
        true_up_output(cur, job_id, attempt, actual, now, lane=lane, output=output)
    return Settled(job_id, attempt, lane, est, actual, overage, False, outcome, by_estimate=bool(by_estimate)), after


def _lock_lanes_left(cur: Cursor, job_id: str) -> None:
    """PostgreSQL: lanes are locked in name order, as the reaper locks them all: a lane the job left (a late
    settlement may bill it) whose name comes before the lane it is in now is locked before that one."""
    # (compared and ordered by the database, in the collation of the reaper's "order by name")
    for (name,) in cur.all(queries.SETTLEMENT_LOCK_LANES_LEFT, {"j": job_id}):
        lock_lane(cur, name)


def _billed_lane(cur: Cursor, job_id: str, attempt: int, row: LaneRow, now: float) -> str:
    """The lane a late settlement of ``attempt`` bills (locked, its period rolled): where it was leased."""
    left = ran_in(cur, job_id, attempt)
    if left is None or left == row.name:
        return row.name
    roll_counters(cur, lock_lane(cur, left), now)
    return left


def which_attempt(job: dict, done: dict[int, int]) -> int:
    """The attempt a settlement that names none bills: the job's only leased attempt, or refused.

    While a job has been leased once, a bare id means that attempt (a zombie settling after its
    lease was reaped, before the retry is leased, is billed late to it). Once it has been leased
    as several attempts, the bare id cannot say which one spent the tokens, nor whether it
    replays one already settled: guessing would bill the wrong attempt and let the other's
    tokens pass as a replay, so it is refused, naming the attempts.
    """
    last = job["lease_attempt"]
    if last <= 1:
        return last or job["attempt"]  # (never leased: refused as such by the caller)
    status = ", ".join(f"{a} settled {done[a]}" if a in done else f"{a} unsettled" for a in range(1, last + 1))
    raise AmbiguousAttempt(
        f"job {job['id']} has had attempts 1 to {last} leased or waiting ({status}): say which attempt spent these tokens "
        f"({job['id']}:ATTEMPT or --attempt N; lane tick and lane submit print it)",
        job_id=job["id"],
    )


def first_settlement(cur: Cursor, job_id: str, attempt: int | None) -> Settled:
    if attempt is None:
        attempt = get_job(cur, job_id)["attempt"]
    row = cur.one(
        queries.SETTLEMENT_FIRST_SETTLEMENT,
        {"j": job_id, "a": attempt},
    )
    if row is None:
        raise NotLeased(f"job {job_id} attempt {attempt} has no settlement", job_id=job_id)
    lane, est, actual, overage, late, outcome, by_estimate = row
    return Settled(
        job_id, attempt, lane, est, actual, overage, bool(late), outcome, replay=True, by_estimate=bool(by_estimate)
    )


def replayed(first: Settled, actual: int) -> Settled:
    """A settlement of an attempt already settled: the first result if it repeats it, else a conflict."""
    if first.actual != actual:
        raise ConflictingReplay(
            f"job {first.job_id} attempt {first.attempt} was already settled with {first.actual} tokens; this "
            f"settlement says {actual} (a replay must repeat the first; another attempt's tokens must name "
            f"that attempt: {first.job_id}:ATTEMPT)",
            job_id=first.job_id,
            attempt=first.attempt,
        )
    return first
