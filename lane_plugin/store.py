"""The ledger's writes: intake, admission, renewal and settlement.

Each function runs inside one transaction (see :mod:`lane_plugin.db`) and takes
the lane row's lock first (``BEGIN IMMEDIATE`` on SQLite, ``FOR UPDATE`` on
PostgreSQL), so every write that moves a lane's counters is serialised per
lane and the order of locks is always lane, then job. The budget is re-checked
by a conditional UPDATE even though the lock already guarantees it: a bug in
the policy must fail the transaction, never overspend.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import policy
from .db import Cursor
from .errors import ConflictingReplay, LaneError, NeverFits, NotLeased, UnknownJob, UnknownLane
from .lanes import LaneRow, lock_lane, read_lane, roll_counters

ALL_JOB_COLUMNS = (
    "id", "lane", "stage", "est", "est_version", "actual", "state", "attempt", "lease_attempt",
    "lease_until", "lease_token", "deadline", "run_key", "key", "fallback", "reason", "created_at",
    "wait_since", "admitted_at", "finished_at",
)  # fmt: skip
JOB_COLS = "id, lane, stage, est, attempt, run_key, state, lease_until, lease_token, lease_attempt, fallback, key"
JOB_KEYS = tuple(c.strip() for c in JOB_COLS.split(","))


@dataclass(frozen=True)
class Lease:
    """A job the caller may now run, until ``lease_until`` unless renewed."""

    job_id: str
    lane: str
    stage: str
    est: int
    attempt: int
    token: str
    lease_until: float
    run_key: str | None = None


@dataclass(frozen=True)
class Settled:
    """The result of settling one attempt; a replay returns the first result."""

    job_id: str
    attempt: int
    lane: str
    est: int
    actual: int
    overage: int
    late: bool
    outcome: str
    replay: bool = False


class Replay(LaneError):
    """This (job, attempt) is already settled."""


def _job(cur: Cursor, job_id: str) -> dict | None:
    row = cur.one(f"select {JOB_COLS} from job where id = :id", {"id": job_id})
    return None if row is None else dict(zip(JOB_KEYS, row))


def get_job(cur: Cursor, job_id: str) -> dict:
    job = _job(cur, job_id)
    if job is None:
        raise UnknownJob(job_id)
    return job


# -- intake ----------------------------------------------------------------------
def submit(
    cur: Cursor,
    *,
    job_id: str,
    lane: str,
    stage: str,
    est: int,
    now: float,
    est_version: str | None = None,
    run_key: str | None = None,
    key: str | None = None,
    attempt: int = 1,
    deadline: float | None = None,
    fallback: str | bool | None = None,
    shadows: dict[str, int] | None = None,
) -> tuple[str, str]:
    """Record a job (or find it by ``key``); returns ``(job_id, lane)``.

    A known ``key`` with the same stage and estimate is the same job: a higher
    ``attempt`` reopens it (a retry), the same one returns it untouched.
    """
    if key is not None:
        existing = cur.one(f"select {JOB_COLS}, est_version from job where key = :k", {"k": key})
        if existing is not None:
            return _replay_submit(cur, existing, stage=stage, est=est, attempt=attempt, now=now)
    row = read_lane(cur, lane)
    target = row
    fallback_lane = _resolve_fallback(cur, row, fallback)
    starts_run = run_key is None or not _run_started(cur, lane, run_key)
    why = policy.never_fits(row.policy, est, starts_run=starts_run)
    if why is not None:
        if fallback_lane is None:
            raise NeverFits(f"job refused at intake in lane {lane!r}: {why}", lane=lane, est=est)
        target = read_lane(cur, fallback_lane)
        why_fb = policy.never_fits(target.policy, est, starts_run=True)
        if why_fb is not None:
            raise NeverFits(
                f"job refused at intake: lane {lane!r}: {why}; fallback lane {fallback_lane!r}: {why_fb}",
                lane=lane,
                est=est,
            )
        fallback_lane = None
    # No conflict target: a concurrent submit of the same key (PostgreSQL does not serialise
    # intake) or a retried commit of this very id must be a replay, never a unique violation.
    if cur.dialect == "postgresql":
        insert = "insert into job ({cols}) values ({vals}) on conflict do nothing"
    else:
        insert = "insert or ignore into job ({cols}) values ({vals})"
    fields = dict(
        id=job_id, lane=target.name, stage=stage, est=est, est_version=est_version, actual=0,
        state="new", attempt=attempt, lease_attempt=0, lease_until=0.0, run_key=run_key, key=key,
        deadline=deadline, fallback=fallback_lane, created_at=now, wait_since=now,
    )  # fmt: skip
    cur.execute(
        insert.format(cols=", ".join(fields), vals=", ".join(":" + k for k in fields)), fields
    )
    if cur.rowcount != 1:
        if key is not None:
            existing = cur.one(f"select {JOB_COLS}, est_version from job where key = :k", {"k": key})
            if existing is not None and existing[0] != job_id:
                return _replay_submit(cur, existing, stage=stage, est=est, attempt=attempt, now=now)
        return job_id, target.name  # this id was committed by an earlier try of this transaction
    for version, shadow_est in (shadows or {}).items():
        cur.execute(
            "insert into shadow_estimate (job_id, version, est) values (:j, :v, :e)",
            {"j": job_id, "v": version, "e": shadow_est},
        )
    return job_id, target.name


def _replay_submit(cur: Cursor, existing, *, stage: str, est: int, attempt: int, now: float):
    job = dict(zip(JOB_KEYS + ("est_version",), existing))
    if job["stage"] != stage or job["est"] != est:
        raise ConflictingReplay(
            f"key {job['key']!r} already names job {job['id']} with stage {job['stage']!r} and "
            f"estimate {job['est']}; this request has stage {stage!r} and estimate {est}",
            job_id=job["id"],
        )
    if attempt > job["attempt"]:
        reopen(cur, job, attempt=attempt, now=now)
    return job["id"], job["lane"]


def reopen(cur: Cursor, job: dict, *, attempt: int, now: float) -> None:
    """Start a new attempt of a job; a lease still held by an older attempt is voided."""
    lock_lane(cur, job["lane"])
    if job["state"] == "leased":
        cur.execute(
            "update lane set reserved = reserved - :e, leased = leased - 1 where name = :l",
            {"e": job["est"], "l": job["lane"]},
        )
    if job["state"] == "parked":
        cur.execute("delete from tail where job_id = :id", {"id": job["id"]})
    cur.execute(
        "update job set state = 'new', attempt = :a, lease_token = null, lease_until = 0, "
        "wait_since = :now, reason = null, finished_at = null where id = :id",
        {"a": attempt, "now": now, "id": job["id"]},
    )


def _resolve_fallback(cur: Cursor, row: LaneRow, fallback: str | bool | None) -> str | None:
    if fallback is None or fallback is False:
        return None
    name = row.fallback if fallback is True else fallback
    if name is None:
        return None
    if name == row.name:
        return None
    if cur.scalar("select name from lane where name = :n", {"n": name}) is None:
        raise UnknownLane(name)
    return name


def _run_started(cur: Cursor, lane: str, run_key: str) -> bool:
    return (
        cur.scalar("select 1 from lane_run where lane = :l and run_key = :r", {"l": lane, "r": run_key})
        is not None
    )


# -- admission -------------------------------------------------------------------
def tick(cur: Cursor, lane: str, *, now: float, token: str, head_extra: int = 16):
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
    from .errors import LeaseLost

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


# -- settlement ------------------------------------------------------------------
def settle(
    cur: Cursor, job_id: str, *, actual: int, attempt: int | None, outcome: str, now: float
) -> tuple[Settled, tuple[int, int, int]]:
    """Bill what one attempt really spent, exactly once (raises :class:`Replay` if already).

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
        raise NotLeased(
            f"job {job_id} attempt {attempt} was never leased (state {job['state']}, "
            f"last leased attempt {job['lease_attempt'] or 'none'})",
            job_id=job_id,
        )
    lane = job["lane"]
    # Locks in the order lane, then job, as every writer does; and rolls the period first: a
    # settlement arriving after a period boundary but before the next tick must count in the new
    # period, not be wiped by that tick's reset.
    roll_counters(cur, lock_lane(cur, lane), now)
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
        "insert into settlement (job_id, attempt, lane, est, actual, overage, late, outcome, settled_at) "
        "values (:j, :att, :l, :e, :a, :o, :late, :out, :now) on conflict do nothing",
        {"j": job_id, "att": attempt, "l": lane, "e": est if live else 0, "a": actual, "o": overage,
         "late": not live, "out": outcome, "now": now},
    )  # fmt: skip
    if cur.rowcount != 1:
        raise Replay()  # a concurrent settle of the same attempt won; roll back ours
    if live:
        after = cur.one(
            "update lane set spent = spent + :a, reserved = reserved - :e, leased = leased - 1, "
            "overage = overage + :o, updated_at = :now where name = :l returning spent, ceiling, overage",
            {"a": actual, "e": est, "o": overage, "now": now, "l": lane},
        )
    else:
        cur.execute("update job set actual = actual + :a where id = :id", {"a": actual, "id": job_id})
        after = cur.one(
            "update lane set spent = spent + :a, overage = overage + :o, updated_at = :now where name = :l "
            "returning spent, ceiling, overage",
            {"a": actual, "o": overage, "now": now, "l": lane},
        )
    return Settled(job_id, attempt, lane, est if live else 0, actual, overage, not live, outcome), tuple(after)


def first_settlement(cur: Cursor, job_id: str, attempt: int | None) -> Settled:
    if attempt is None:
        attempt = get_job(cur, job_id)["attempt"]
    row = cur.one(
        "select lane, est, actual, overage, late, outcome from settlement where job_id = :j and attempt = :a",
        {"j": job_id, "a": attempt},
    )
    if row is None:
        raise NotLeased(f"job {job_id} attempt {attempt} has no settlement", job_id=job_id)
    lane, est, actual, overage, late, outcome = row
    return Settled(job_id, attempt, lane, est, actual, overage, bool(late), outcome, replay=True)
