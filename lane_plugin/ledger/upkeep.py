"""Upkeep writes: reaping expired leases, parking, requeueing, dropping and expiring the tail.

All are set-based (one UPDATE ... RETURNING per kind, not a loop per job) so
that parking 100,000 overdue jobs is a few statements, and all are guarded by
the state they expect (``where state = 'new'``...), so two copies running at
once move each job exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import NotParked, UnknownJob
from ..policy import never_fits
from . import leases, queries, tenants
from .db import Cursor
from .jobs import left_lane, lock_job
from .lanes import LaneRow, all_lanes, lock_lane, read_lane
from .limits import drop_pending as drop_limit_pending
from .periods import period_start, roll_counters
from .rates import drop_pending
from .waiters import WAITER_GONE


@dataclass
class Moved:
    """Jobs an upkeep pass moved, by what happened to them."""

    requeued: list[str] = field(default_factory=list)
    parked: list[dict] = field(default_factory=list)
    expired: list[dict] = field(default_factory=list)
    freed: list[str] = field(default_factory=list)  # lanes where reaping freed room (to hand on)
    bounded: list[str] = field(default_factory=list)  # leases pulled back: set on a clock that has gone back

    def __bool__(self) -> bool:
        return bool(self.requeued or self.parked or self.expired)


def _insert_tail(cur: Cursor, rows: list[dict]) -> None:
    if rows:
        cur.executemany(
            queries.UPKEEP_INSERT_TAIL,
            rows,
        )


def reap(cur: Cursor, *, now: float) -> Moved:
    """Return expired leases to the queue (attempt + 1), or park them when attempts are exhausted.

    A gated job's expired lease means its waiter is gone (its renewer stopped): the job is parked
    (``waiter gone``), not requeued for nobody, and so are the other waiting jobs of that waiter.
    A lease ending further ahead than its lane's ``lease_seconds`` allows (set on a clock that has since
    gone back) is pulled back to ``now + lease_seconds`` first (:mod:`~lane_plugin.ledger.leases`): it
    expires on elapsed time from here unless its holder renews it.
    """
    lanes = {row.name: row for row in all_lanes(cur, lock=True)}
    moved = Moved()
    released: dict[str, list[tuple[int, int]]] = {}  # lane: [(est, est_var)] of the leases it gets back
    why_gone = f"{WAITER_GONE}: its lease expired with no renewal"
    gone: set[str] = set()
    reaped: list[str] = []  # their pending rate charges leave the window: never picked up, never sent
    for lane in lanes.values():
        moved.bounded += leases.bound(cur, lane.name, lane.lease_seconds, now=now)
        orphans = cur.all(
            queries.UPKEEP_REAP_PARK_GATED,
            {"l": lane.name, "now": now, "why": why_gone},
        )
        gone |= {r[3] for r in orphans}
        tail = [
            dict(
                job_id=r[0],
                lane=lane.name,
                stage=r[1],
                est=r[2],
                reason=why_gone,
                parked_at=now,
                deadline=now + lane.park_seconds,
            )
            for r in orphans
        ]
        _insert_tail(cur, tail)
        moved.parked += tail
        if orphans:
            released[lane.name] = [(r[2], r[4]) for r in orphans]
        requeued = cur.all(
            queries.UPKEEP_REAP_REQUEUE,
            {"l": lane.name, "now": now, "max": lane.max_attempts},
        )
        parked = cur.all(
            queries.UPKEEP_REAP_PARK_LAST_ATTEMPT,
            {"l": lane.name, "now": now, "why": f"lease expired on attempt {lane.max_attempts} of {lane.max_attempts}"},
        )
        moved.requeued += [r[0] for r in requeued]
        tail = [
            dict(
                job_id=r[0],
                lane=lane.name,
                stage=r[1],
                est=r[2],
                reason=f"lease expired on attempt {lane.max_attempts} of {lane.max_attempts}",
                parked_at=now,
                deadline=now + lane.park_seconds,
            )
            for r in parked
        ]
        _insert_tail(cur, tail)
        moved.parked += tail
        ests = [(r[1], r[2]) for r in requeued] + [(r[2], r[3]) for r in parked]
        reaped += [r[0] for r in orphans] + [r[0] for r in requeued] + [r[0] for r in parked]
        if ests:
            released.setdefault(lane.name, []).extend(ests)
    for name, ests in released.items():
        cur.execute(
            queries.UPKEEP_REAP_UPDATE_LANE,
            {"e": sum(e for e, _ in ests), "v": sum(v for _, v in ests), "n": len(ests), "now": now, "l": name},
        )
    if reaped:
        drop_pending(cur, reaped)
        drop_limit_pending(cur, reaped)
    moved.parked += drop_waiters(cur, gone, now=now, why=f"{WAITER_GONE}: a lease it held expired with no renewal")
    moved.freed = sorted(released)
    return moved


def drop_waiters(cur: Cursor, waiters: set[str], *, now: float, why: str, lane: str | None = None) -> list[dict]:
    """The waiters are gone: mark them, and park their waiting jobs (in ``lane``, or every lane; locked)."""
    tails: list[dict] = []
    for w in sorted(waiters):
        cur.execute(queries.UPKEEP_DROP_WAITERS_UPDATE_WAITER, {"now": now, "w": w})
        sql = queries.UPKEEP_DROP_WAITERS_UPDATE_JOB_OF_LANE if lane else queries.UPKEEP_DROP_WAITERS_UPDATE_JOB
        rows = cur.all(sql, {"why": why, "now": now, "w": w, "l": lane})
        park_for = {r[1]: read_lane(cur, r[1]).park_seconds for r in rows}
        tails += [
            dict(job_id=r[0], lane=r[1], stage=r[2], est=r[3], reason=why, parked_at=now, deadline=now + park_for[r[1]])
            for r in rows
        ]
    _insert_tail(cur, tails)
    return tails


def park_overdue(cur: Cursor, *, now: float) -> Moved:
    """Park jobs still waiting past their admission deadline."""
    moved = Moved()
    for lane in all_lanes(cur, lock=True):
        rows = cur.all(
            queries.UPKEEP_PARK_OVERDUE,
            {"l": lane.name, "now": now},
        )
        tail = [
            dict(
                job_id=r[0],
                lane=lane.name,
                stage=r[1],
                est=r[2],
                reason="deadline passed while waiting",
                parked_at=now,
                deadline=now + lane.park_seconds,
            )
            for r in rows
        ]
        _insert_tail(cur, tail)
        moved.parked += tail
    return moved


def expire_tail(cur: Cursor, *, now: float) -> Moved:
    """Fail parked jobs whose time in the tail ran out."""
    rows = cur.all(queries.UPKEEP_EXPIRE_TAIL_DELETE_TAIL, {"now": now})
    moved = Moved()
    if rows:
        cur.executemany(
            queries.UPKEEP_EXPIRE_TAIL_UPDATE_JOB,
            [{"id": r[0], "reason": f"expired in the tail ({r[4]})"} for r in rows],
        )
        moved.expired = [dict(job_id=r[0], lane=r[1], stage=r[2], est=r[3], reason=r[4]) for r in rows]
    return moved


def park(cur: Cursor, job_id: str, *, reason: str, now: float) -> dict | None:
    """Park one waiting job; None if it was no longer waiting (decided under its lane's lock, on a fresh read:
    a job moved to its fallback meanwhile is parked there, with that lane's tail deadline)."""
    lane, job = lock_job(cur, job_id)
    cur.execute(
        queries.UPKEEP_PARK,
        {"why": reason, "now": now, "id": job_id, "l": lane.name},
    )
    if cur.rowcount != 1:
        return None
    tail = dict(
        job_id=job_id,
        lane=lane.name,
        stage=job["stage"],
        est=job["est"],
        reason=reason,
        parked_at=now,
        deadline=now + lane.park_seconds,
    )
    _insert_tail(cur, [tail])
    return tail


def give_up_never_fitting(cur: Cursor, row: LaneRow, *, now: float) -> list[dict]:
    """Waiting jobs of lane ``row`` its new settings leave no way to fit: to their fallback, or parked.

    Intake refuses a job that can never fit (:func:`lane_plugin.policy.never_fits`); lowering a lane's
    burst under a waiting job's rate cost, or its ceiling under its estimate, makes one afterwards, and no
    reset of the lane's period helps it: it would wait for ever. Called by :meth:`Ledger.set_lane` in
    the settings' own transaction (the lane locked). Returns the tails of those parked.
    """
    pol = row.policy
    # With limits over other units, every waiting job of the lane is read (a settings change, not admission).
    sql = queries.UPKEEP_WAITING_JOBS if pol.limits else queries.UPKEEP_WAITING_JOBS_OVER
    found = cur.all(sql, {"l": row.name, "burst": pol.burst_tokens, "ceiling": pol.ceiling})
    tails = []
    for job_id, est, rate_cost, rate_input, rate_output in found:
        why = never_fits(
            pol, est, starts_run=False, rate_cost=rate_cost, input_cost=rate_input, output_cost=rate_output
        )
        tail = (
            None
            if why is None
            else give_up(
                cur, job_id, reason=f"cannot fit in lane {row.name!r} since its settings changed: {why}", now=now
            )
        )
        if tail is not None:
            tails.append(tail)
    return tails


def give_up(cur: Cursor, job_id: str, *, reason: str, now: float) -> dict | None:
    """A waiting job that cannot fit its lane: to its fallback lane (None), or parked with ``reason`` (its tail)."""
    if move_to_fallback(cur, job_id, now=now) is not None:
        return None
    return park(cur, job_id, reason=reason + _fallback_not_asked(cur, job_id), now=now)


def _fallback_not_asked(cur: Cursor, job_id: str) -> str:
    """What to say of the job's lane's fallback when the job did not ask for one (a fallback lane may cost
    money, so a job moves only if it asks): a lane's ``fallback`` set and a job parked anyway surprised."""
    row = cur.one(queries.UPKEEP_MOVE_TO_FALLBACK_SELECT_JOB, {"id": job_id})
    fallback = read_lane(cur, row[0]).fallback if row is not None and not row[1] else None
    if not fallback:
        return ""
    return (
        f" (lane {row[0]!r} falls back to {fallback!r} only for jobs that ask: fallback=True on lane_task "
        "or gate(), --fallback lane on lane submit)"
    )


def _fresh_place(cur: Cursor, lane: str) -> tuple[str, dict]:
    prio, params = read_lane(cur, lane).prio_sql(":now", queries.UNDER_WAY)
    return queries.fresh_place(prio), params


def move_to_fallback(cur: Cursor, job_id: str, *, now: float) -> str | None:
    """Send a waiting job to its fallback lane; returns that lane, or None if it has none."""
    row = cur.one(queries.UPKEEP_MOVE_TO_FALLBACK_SELECT_JOB, {"id": job_id})
    if row is None:
        raise UnknownJob(job_id)
    if not row[1] or row[2] != "new":
        return None
    # A tick of the old lane may be choosing this job right now: wait for its lane lock, so the
    # job is either leased there (and stays) or moved here, never leased there and billed here.
    lock_lane(cur, row[0])
    place, params = _fresh_place(cur, row[1])
    moved = cur.all(
        queries.upkeep_move_to_fallback_update_job(place),
        {"fb": row[1], "to": row[1], "now": now, "id": job_id, "old": row[0], **params},
    )
    tenants.ensure(cur, row[1], (r[2] for r in moved), now)  # its tenant has a row in its new lane
    moved = [(r[0], r[1]) for r in moved]
    left_lane(cur, row[0], moved, now)  # a late settlement of an attempt leased there is billed there
    return row[1] if moved else None


def fall_back_waiting(cur: Cursor, lane: str, *, now: float) -> int:
    """Preflight failed: every waiting job of ``lane`` that may fall back moves to its fallback."""
    moved = 0
    for (fb,) in cur.all(queries.UPKEEP_FALL_BACK_WAITING_SELECT_JOB, {"l": lane}):
        place, params = _fresh_place(cur, fb)
        rows = cur.all(
            queries.upkeep_fall_back_waiting_update_job(place),
            {"l": lane, "fb": fb, "to": fb, "now": now, **params},
        )
        tenants.ensure(cur, fb, (r[2] for r in rows), now)
        rows = [(r[0], r[1]) for r in rows]
        left_lane(cur, lane, rows, now)
        moved += len(rows)
    return moved


def requeue(cur: Cursor, job_id: str, *, now: float) -> None:
    """Put a parked job back in the queue, as a new attempt if its last one was leased."""
    row = cur.one(queries.UPKEEP_REQUEUE_SELECT_JOB, {"id": job_id})
    if row is None:
        raise UnknownJob(job_id)
    if row[0] != "parked":
        raise NotParked(f"job {job_id} is {row[0]}, not parked: only parked jobs can be requeued", job_id=job_id)
    lane = lock_lane(cur, row[1])
    cur.execute(queries.UPKEEP_REQUEUE_DELETE_TAIL, {"id": job_id})
    prio, params = lane.prio_sql(":now")
    cur.execute(
        queries.upkeep_requeue_update_job(prio),
        {"now": now, "id": job_id, **params},
    )


def drop(cur: Cursor, job_id: str, *, now: float) -> None:
    """Give up on a parked job: it fails with the reason 'dropped'."""
    row = cur.one(queries.UPKEEP_DROP_SELECT_JOB, {"id": job_id})
    if row is None:
        raise UnknownJob(job_id)
    if row[0] != "parked":
        raise NotParked(f"job {job_id} is {row[0]}, not parked: only parked jobs can be dropped", job_id=job_id)
    cur.execute(queries.UPKEEP_DROP_DELETE_TAIL, {"id": job_id})
    cur.execute(
        queries.UPKEEP_DROP_UPDATE_JOB,
        {"now": now, "id": job_id},
    )


def roll_periods(cur: Cursor, *, now: float) -> list[dict]:
    """Start a new accounting period in every lane whose period rolled over (spent and overage reset).

    Admission does this lazily for the lane it ticks; this does it for all lanes,
    so an idle lane's counters (and ``lane lanes``) show the new period too.
    """
    rolled = []
    for row in all_lanes(cur, lock=True):
        if row.period != "none" and period_start(row.period, now) > row.period_start:
            before = dict(spent=row.spent, overage=row.overage, period_start=row.period_start)
            roll_counters(cur, row, now)
            rolled.append(dict(lane=row.name, period=row.period, period_start=row.period_start, previous=before))
    return rolled
