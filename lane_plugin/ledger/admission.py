"""Admission: one tick leases what fits in a lane; a running holder renews its lease.

Each function runs inside one transaction (see :mod:`lane_plugin.ledger.db`) and
takes the lane row's lock first (``BEGIN IMMEDIATE`` on SQLite, ``FOR UPDATE``
on PostgreSQL), so every write that moves a lane's counters is serialised per
lane and the order of locks is always lane, then job. The budget is re-checked
by a conditional UPDATE even though the lock already guarantees it: a bug in
the policy must fail the transaction, never overspend.
"""

from __future__ import annotations

from .. import policy
from ..errors import LaneError, LeaseLost, UnknownJob
from .db import Cursor
from .jobs import Lease
from .lanes import lock_lane, roll_counters


def tick(cur: Cursor, lane: str, *, now: float, token: str, head_extra: int = policy.HEAD_SLACK):
    """Lease what fits in ``lane`` now. Returns ``(leases, decision, before, after)``."""
    row = roll_counters(cur, lock_lane(cur, lane), now)
    snap_kw = dict(
        policy=row.policy, spent=row.spent, reserved=row.reserved, leased=row.leased,
        window_used=row.window_used, now=now, stopped=row.is_stopped,
    )  # fmt: skip
    free_slots = row.max_leased - row.leased
    if row.is_stopped or free_slots <= 0:
        return [], policy.Decision((), 0, None, policy.STOPPED if row.is_stopped else policy.LEASE_CAP), row
    limit = free_slots + head_extra
    cols = "id, est, wait_since, run_key, stage, attempt"
    # The head of two indexes in one round trip: the oldest due jobs, then the smallest jobs.
    head = cur.all(
        f"select * from (select {cols} from job where lane = :l and state = 'new' and wait_since <= :cut "
        f"order by wait_since limit :k) as due union all "
        f"select * from (select {cols} from job where lane = :l and state = 'new' "
        f"order by est, wait_since limit :k) as small",
        {"l": lane, "cut": now - row.max_wait_seconds, "k": limit},
    )
    rows = {r[0]: r for r in head}
    if not rows:
        return [], policy.Decision((), 0), row
    run_keys = sorted({r[3] for r in rows.values() if r[3] is not None})
    started: set[str] = set()
    if run_keys:
        params = {f"r{i}": k for i, k in enumerate(run_keys)}
        params["l"] = lane
        marks = ", ".join(":" + p for p in params if p != "l")
        started = {
            r[0]
            for r in cur.all(f"select run_key from lane_run where lane = :l and run_key in ({marks})", params)
        }
    def decide() -> policy.Decision:
        snapshot = policy.LaneSnapshot(**snap_kw, started_runs=frozenset(started))
        return policy.admit(snapshot, [policy.Candidate(r[0], r[1], r[2], r[3]) for r in rows.values()])

    decision = decide()
    if decision.head_reason == policy.START_LIMIT and len(decision.admitted) < free_slots:
        # Past the start limit the head holds jobs that would start runs; the later stages of
        # runs under way (which may still use the last fifth) can sit further down. Read their head.
        finishing = cur.all(
            f"select {', '.join('j.' + c.strip() for c in cols.split(','))} from job j join lane_run r "
            "on r.lane = j.lane and r.run_key = j.run_key where j.lane = :l and j.state = 'new' "
            "order by j.est, j.wait_since limit :k",
            {"l": lane, "k": limit},
        )
        if any(r[0] not in rows for r in finishing):
            rows.update({r[0]: r for r in finishing})
            started |= {r[3] for r in finishing}
            decision = decide()
    if not decision.admitted:
        return [], decision, row
    n, tokens = len(decision.admitted), decision.tokens
    cur.execute(
        "update lane set reserved = reserved + :t, leased = leased + :n, window_used = window_used + :t, "
        "updated_at = :now where name = :l and spent + reserved + :t <= ceiling and leased + :n <= max_leased",
        {"t": tokens, "n": n, "now": now, "l": lane},
    )
    if cur.rowcount != 1:
        raise LaneError(f"admission re-check failed in lane {lane!r}: the policy chose past the ceiling")
    ids = decision.ids
    lease_until = now + row.lease_seconds
    for job_id in ids:
        # One primary-key update per job: with "id in (...) and state = 'new'" SQLite's planner
        # picks the state index and walks every waiting job.
        cur.execute(
            "update job set state = 'leased', lease_until = :lu, lease_token = :tok, lease_attempt = attempt, "
            "admitted_at = coalesce(admitted_at, :now) where id = :id and state = 'new'",
            {"id": job_id, "lu": lease_until, "tok": token, "now": now},
        )
        if cur.rowcount != 1:
            raise LaneError(f"admission in lane {lane!r} lost a race it cannot lose (lock not held?)")
    new_runs = sorted({c.run_key for c in decision.admitted if c.run_key is not None} - started)
    for rk in new_runs:
        cur.execute(
            "insert into lane_run (lane, run_key, started_at) values (:l, :r, :now) on conflict do nothing",
            {"l": lane, "r": rk, "now": now},
        )
    leases = [
        Lease(r[0], lane, r[4], r[1], r[5], token, lease_until, r[3]) for r in (rows[i] for i in ids)
    ]
    return leases, decision, row


def renew(cur: Cursor, job_id: str, token: str, *, now: float) -> float:
    """Extend a held lease; raises :class:`LeaseLost` if it is no longer this holder's."""
    row = cur.one(
        "select j.state, j.lease_token, l.lease_seconds, j.lease_until from job j join lane l on l.name = j.lane "
        "where j.id = :id",
        {"id": job_id},
    )
    if row is None:
        raise UnknownJob(job_id)
    state, held, lease_seconds, _ = row
    if state != "leased" or held != token:
        raise LeaseLost(f"job {job_id} lost its lease (state {state})", job_id=job_id)
    until = now + lease_seconds
    cur.execute(
        "update job set lease_until = :u where id = :id and state = 'leased' and lease_token = :tok",
        {"u": until, "id": job_id, "tok": token},
    )
    if cur.rowcount != 1:
        raise LeaseLost(f"job {job_id} lost its lease", job_id=job_id)
    return until
