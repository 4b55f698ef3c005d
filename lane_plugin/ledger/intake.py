"""Intake: a job enters the ledger (or is found again by its idempotency key)."""

from __future__ import annotations

from ..errors import ConflictingReplay, LaneError, NeverFits
from ..policy import never_fits
from ..policy.fairness import DEFAULT_TENANT
from . import queries, tenants
from .db import Cursor
from .jobs import JOB_KEYS, lock_job, run_started
from .lanes import LaneRow, read_lane, unknown_lane
from .limits import drop_pending as drop_limit_pending
from .overtake import PENDING
from .rates import drop_pending
from .waiters import WAITER_GONE


def submit(
    cur: Cursor,
    *,
    job_id: str,
    lane: str,
    stage: str,
    est: int,
    now: float,
    rate_cost: int | None = None,
    est_version: str | None = None,
    est_input: int | None = None,
    est_var: int = 0,
    run_key: str | None = None,
    key: str | None = None,
    attempt: int = 1,
    deadline: float | None = None,
    fallback: str | bool | None = None,
    shadows: dict[str, int] | None = None,
    rerun: bool = False,
    tenant: str = DEFAULT_TENANT,
    rate_input: int | None = None,
    rate_output: int | None = None,
) -> tuple[str, str]:
    """Record a job (or find it by ``key``); returns ``(job_id, lane)``.

    A known ``key`` with the same stage and estimate is the same job: a higher
    ``attempt`` reopens it (a retry), the same one returns it untouched, unless
    ``rate_input`` / ``rate_output``: the job's units for the lane's ``input_tokens`` / ``output_tokens``
    limits (None: unknown; its rate cost counts against each). ``rerun``: the caller is about to run the work again (the gate, whose task run a Dask
    worker's death or a lost result made run again with the same ``run_count``), so a job
    already leased, settled or failed at this attempt starts the next attempt; the holder of
    the old lease, if it is alive at all, settles late, billed as its own attempt. ``tenant``: who the job
    belongs to inside its lane (given a ``tenant`` row there if it has none: weight 1, no budget).
    """
    if key is not None:
        existing = cur.one(queries.INTAKE_JOB_BY_KEY, {"k": key})
        if existing is not None:  # (this very id: a retried commit of this submit, not a rerun)
            rerun = rerun and existing[0] != job_id
            return _replay_submit(cur, existing, stage=stage, est=est, attempt=attempt, now=now, rerun=rerun)
    row = read_lane(cur, lane)
    target = row
    fallback_lane = _resolve_fallback(cur, row, fallback)
    # A job without a run starts none: no start limit for it, and no reserve.
    started = run_key is not None and run_started(cur, lane, run_key)
    rate_cost = est if rate_cost is None else rate_cost
    why = never_fits(
        row.policy,
        est,
        starts_run=run_key is not None and not started,
        rate_cost=rate_cost,
        var=est_var,
        input_cost=rate_input,
        output_cost=rate_output,
    )
    if why is not None:
        if fallback_lane is None:
            raise NeverFits(f"job refused at intake in lane {lane!r}: {why}", lane=lane, est=est)
        target = read_lane(cur, fallback_lane)
        started = run_key is not None and run_started(cur, target.name, run_key)
        why_fb = never_fits(
            target.policy,
            est,
            starts_run=run_key is not None,
            rate_cost=rate_cost,
            var=est_var,
            input_cost=rate_input,
            output_cost=rate_output,
        )
        if why_fb is not None:
            raise NeverFits(
                f"job refused at intake: lane {lane!r}: {why}; fallback lane {fallback_lane!r}: {why_fb}",
                lane=lane,
                est=est,
            )
        fallback_lane = None
    # No conflict target: a concurrent submit of the same key (PostgreSQL does not serialise
    # intake) or a retried commit of this very id must be a replay, never a unique violation.
    fields = dict(
        id=job_id,
        lane=target.name,
        stage=stage,
        est=est,
        est_version=est_version,
        est_input=est_input,
        est_var=est_var,
        actual=0,
        state="new",
        attempt=attempt,
        lease_attempt=0,
        lease_until=0.0,
        run_key=run_key,
        key=key,
        deadline=deadline,
        fallback=fallback_lane,
        created_at=now,
        wait_since=now,
        rate_cost=rate_cost,
        prio=target.priority(est, now, started),
        finishing=started,
        tenant=tenant,
        rate_input=rate_input,
        rate_output=rate_output,
    )
    if target.overtake_slack is not None:  # rule 12: numbered by the lane's next tick (overtake.number)
        fields["arrival_pos"] = PENDING
    cur.execute(queries.intake_insert_job(cur.dialect, fields), fields)
    if cur.rowcount != 1:
        if key is not None:
            existing = cur.one(queries.INTAKE_JOB_BY_KEY, {"k": key})
            if existing is not None and existing[0] != job_id:
                return _replay_submit(cur, existing, stage=stage, est=est, attempt=attempt, now=now, rerun=rerun)
        return job_id, target.name  # this id was committed by an earlier try of this transaction
    tenants.ensure(cur, target.name, (tenant,), now)
    for version, shadow_est in (shadows or {}).items():
        cur.execute(
            queries.INTAKE_SUBMIT_INSERT_SHADOW_ESTIMATE,
            {"j": job_id, "v": version, "e": shadow_est},
        )
    return job_id, target.name


def _replay_submit(cur: Cursor, existing, *, stage: str, est: int, attempt: int, now: float, rerun: bool = False):
    job = dict(zip(JOB_KEYS + ("est_version",), existing))
    if job["stage"] != stage or job["est"] != est:
        raise ConflictingReplay(
            f"key {job['key']!r} already names job {job['id']} with stage {job['stage']!r} and "
            f"estimate {job['est']}; this request has stage {stage!r} and estimate {est}",
            job_id=job["id"],
        )
    if attempt > job["attempt"]:
        reopen(cur, job, attempt=attempt, now=now)
    elif rerun and (job["state"] in ("leased", "done", "failed") or _waiter_gone(cur, job)):
        # parked "waiter gone": its waiter died (a killed Dask worker) and this run is the rerun; as a new
        # attempt it is 'new' again, so the caller's waiter claims it (else it keeps the dead one's for ever)
        reopen(cur, job, attempt=job["attempt"] + 1, now=now)
    return job["id"], job["lane"]


def _waiter_gone(cur: Cursor, job: dict) -> bool:
    if job["state"] != "parked":
        return False
    reason = cur.one(queries.INTAKE_WAITER_GONE, {"id": job["id"]})[0]
    return (reason or "").startswith(WAITER_GONE)


def reopen(cur: Cursor, job: dict, *, attempt: int, now: float) -> None:
    """Start a new attempt of a job; a lease still held by an older attempt is voided.

    ``job`` was read before the lane lock: the decision is taken again on a fresh read under
    it, so a settle or reap of the old attempt that committed meanwhile is not undone twice.
    """
    row, job = lock_job(cur, job["id"])
    if attempt <= job["attempt"]:
        return  # another retry (or the reaper) already moved the job on
    if job["state"] == "leased":
        cur.execute(
            queries.INTAKE_REOPEN_UPDATE_LANE,
            {"e": job["est"], "v": job["est_var"], "l": job["lane"]},
        )
        drop_pending(cur, [job["id"]])
        drop_limit_pending(cur, [job["id"]])  # a lease voided before its pick-up: its request never went out
    if job["state"] == "parked":
        cur.execute(queries.INTAKE_REOPEN_DELETE_TAIL, {"id": job["id"]})
    finishing = job["run_key"] is not None and run_started(cur, row.name, job["run_key"])
    cur.execute(
        queries.INTAKE_REOPEN_UPDATE_JOB,
        {
            "a": attempt,
            "now": now,
            "p": row.priority(job["est"], now, finishing),
            "id": job["id"],
            "st": job["state"],
            "old": job["attempt"],
        },
    )
    if cur.rowcount != 1:  # cannot happen under the locks; never let counters and rows part
        raise LaneError(f"reopen of job {job['id']} lost a race it cannot lose (lock not held?)")


def _resolve_fallback(cur: Cursor, row: LaneRow, fallback: str | bool | None) -> str | None:
    if fallback is None or fallback is False:
        return None
    name = row.fallback if fallback is True else fallback
    if name is None:
        return None
    if name == row.name:
        return None
    if cur.scalar(queries.INTAKE_RESOLVE_FALLBACK, {"n": name}) is None:
        raise unknown_lane(cur, name)
    return name
