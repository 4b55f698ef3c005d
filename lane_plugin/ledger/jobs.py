"""Job rows as the ledger's writers read them, and what a caller gets back (leases, settlements)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UnknownJob
from . import queries
from .db import Cursor
from .lanes import LaneRow, lock_lane
from .queries import ALL_JOB_COLUMNS as ALL_JOB_COLUMNS
from .queries import JOB_COLS as JOB_COLS

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
    rate_cost: int | None = None  # what the provider's rate limiter was charged for it
    tenant: str = "default"  # who it belongs to inside its lane


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
    by_estimate: bool = False  # billed its estimate: no usage was found


def find_job(cur: Cursor, job_id: str) -> dict[str, Any] | None:
    row = cur.one(queries.JOBS_FIND_JOB, {"id": job_id})
    return None if row is None else dict(zip(JOB_KEYS, row))


def get_job(cur: Cursor, job_id: str) -> dict[str, Any]:
    job = find_job(cur, job_id)
    if job is None:
        raise UnknownJob(job_id)
    return job


def run_started(cur: Cursor, lane: str, run_key: str) -> bool:
    return cur.scalar(queries.JOBS_RUN_STARTED, {"l": lane, "r": run_key}) is not None


def lock_job(cur: Cursor, job_id: str) -> tuple[LaneRow, dict[str, Any]]:
    """The job's lane row, locked, and the job read fresh under that lock (and locked itself).

    Every state transition decides on this read, never on one taken before the lock: on
    PostgreSQL another transaction may have settled, reaped or reopened the job in between.
    The lock order is lane, then job, as every writer's; a job moved to another lane (its
    fallback) while we waited is followed to its new lane.
    """
    sql = queries.JOBS_FIND_JOB_FOR_UPDATE if cur.dialect == "postgresql" else queries.JOBS_FIND_JOB
    job = get_job(cur, job_id)
    for _ in range(8):
        row = lock_lane(cur, job["lane"])
        fresh = cur.one(sql, {"id": job_id})
        if fresh is None:
            raise UnknownJob(job_id)
        job = dict(zip(JOB_KEYS, fresh))
        if job["lane"] == row.name:
            return row, job
    raise UnknownJob(job_id)  # pragma: no cover - moved between lanes eight times while we waited


def left_lane(cur: Cursor, lane: str, moved: list[tuple[str, int]], now: float) -> None:
    """Jobs ``(id, lease_attempt)`` just moved out of ``lane`` (its lock held): the attempts leased there
    ran there, and a late settlement of one bills ``lane`` (:func:`ran_in`). A job never leased records nothing.

    A move keeps the row of an earlier one with the same ``leased_upto`` (leased in neither lane since):
    those attempts ran in the lane that move left.
    """
    rows = [{"j": j, "u": upto, "l": lane, "now": now} for j, upto in moved if upto]
    if rows:
        cur.executemany(queries.JOBS_LEFT_LANE, rows)


def ran_in(cur: Cursor, job_id: str, attempt: int) -> str | None:
    """The lane a job's attempt was leased in, if the job has left it since; None: its current lane.

    The first move after the attempt was leased is the one that took the job out of the attempt's lane.
    """
    return cur.scalar(queries.JOBS_RAN_IN, {"j": job_id, "a": attempt})
