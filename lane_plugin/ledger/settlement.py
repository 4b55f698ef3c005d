"""Settlement: bill what one attempt really spent, exactly once (TigerBeetle's *post*)."""

from __future__ import annotations

from ..errors import JobParked, NotLeased, Replay, UnknownJob
from .db import Cursor
from .jobs import JOB_KEYS, Settled, get_job
from .lanes import lock_lane, roll_counters
from .rates import true_up


def settle(
    cur: Cursor, job_id: str, *, actual: int, attempt: int | None, outcome: str, now: float,
    by_estimate: bool = False,
) -> tuple[Settled, tuple[int, int, int]]:
    """Bill what one attempt really spent, exactly once (raises :class:`Replay` if already).

    ``by_estimate`` marks an attempt billed its estimate because no usage was found.
    Returns the settlement and the lane's ``(spent, ceiling, overage)`` after it.
    """
    row = cur.one(
        f"select {', '.join('j.' + c for c in JOB_KEYS)}, s.id from job j "
        "left join settlement s on s.job_id = j.id and s.attempt = coalesce(:a, j.attempt) where j.id = :id",
        {"id": job_id, "a": attempt},
    )
    if row is None:
        raise UnknownJob(job_id)
    job = dict(zip(JOB_KEYS, row[:-1]))
    attempt = job["attempt"] if attempt is None else attempt
    if row[-1] is not None:
        raise Replay()
    if attempt > job["lease_attempt"] or attempt < 1:
        if job["state"] == "parked":
            raise JobParked(f"job {job_id} is parked and was never leased for attempt {attempt}: nothing to settle "
                            "(requeue it with lane tail requeue, or drop it)", job_id=job_id)  # fmt: skip
        raise NotLeased(
            f"job {job_id} attempt {attempt} was never leased (state {job['state']}, "
            f"last leased attempt {job['lease_attempt'] or 'none'})",
            job_id=job_id,
        )
    lane = job["lane"]
    # Locks in the order lane, then job, as every writer does; and rolls the period first: a
    # settlement arriving after a period boundary but before the next tick must count in the new
    # period, not be wiped by that tick's reset.
    lane_row = roll_counters(cur, lock_lane(cur, lane), now)
    final = "done" if outcome == "done" else "failed"
    cur.execute(
        "update job set state = :st, actual = actual + :a, finished_at = :now, lease_token = null "
        "where id = :id and state = 'leased' and attempt = :att",
        {"st": final, "a": actual, "now": now, "id": job_id, "att": attempt},
    )
    live = cur.rowcount == 1
    est = job["est"]
    overage = max(0, actual - est) if live else actual
    cur.execute(
        "insert into settlement (job_id, attempt, lane, est, actual, overage, late, by_estimate, outcome, "
        "settled_at) values (:j, :att, :l, :e, :a, :o, :late, :be, :out, :now) on conflict do nothing",
        {"j": job_id, "att": attempt, "l": lane, "e": est if live else 0, "a": actual, "o": overage,
         "late": not live, "be": bool(by_estimate), "out": outcome, "now": now},
    )  # fmt: skip
    if cur.rowcount != 1:
        raise Replay()  # a concurrent settle of the same attempt won; roll back ours
    if lane_row.rate_basis == "actual":  # the provider counted what was really used: so does the window
        true_up(cur, lane, job_id, attempt, actual)
    if live:
        after = cur.one(
            "update lane set spent = spent + :a, reserved = reserved - :e, reserved_var = reserved_var - :v, "
            "leased = leased - 1, overage = overage + :o, updated_at = :now where name = :l "
            "returning spent, ceiling, overage",
            {"a": actual, "e": est, "v": job["est_var"], "o": overage, "now": now, "l": lane},
        )
    else:
        cur.execute("update job set actual = actual + :a where id = :id", {"a": actual, "id": job_id})
        after = cur.one(
            "update lane set spent = spent + :a, overage = overage + :o, updated_at = :now where name = :l "
            "returning spent, ceiling, overage",
            {"a": actual, "o": overage, "now": now, "l": lane},
        )
    settled = Settled(job_id, attempt, lane, est if live else 0, actual, overage, not live, outcome,
                      by_estimate=bool(by_estimate))  # fmt: skip
    return settled, tuple(after)


def first_settlement(cur: Cursor, job_id: str, attempt: int | None) -> Settled:
    if attempt is None:
        attempt = get_job(cur, job_id)["attempt"]
    row = cur.one(
        "select lane, est, actual, overage, late, outcome, by_estimate from settlement "
        "where job_id = :j and attempt = :a",
        {"j": job_id, "a": attempt},
    )
    if row is None:
        raise NotLeased(f"job {job_id} attempt {attempt} has no settlement", job_id=job_id)
    lane, est, actual, overage, late, outcome, by_estimate = row
    return Settled(job_id, attempt, lane, est, actual, overage, bool(late), outcome, replay=True,
                   by_estimate=bool(by_estimate))  # fmt: skip
