"""The ledger's invariants (I1-I7, docs/architecture.md), checked from the tables alone."""

from __future__ import annotations

from . import leases, queries
from .db import Cursor
from .lanes import all_lanes


def audit(cur: Cursor, now: float, *, grace: float = 60.0) -> list[str]:
    """Return one line per violation; an empty list means the ledger is sound.

    ``grace`` is the reap interval: a lease may be held past its expiry until
    the next reap, but not longer.
    """
    bad: list[str] = []
    leased = {r[0]: (r[1], r[2], r[3]) for r in cur.all(queries.AUDIT_LEASED_BY_LANE)}
    for lane in all_lanes(cur):
        n, est, var = leased.get(lane.name, (0, 0, 0))
        if lane.reserved_var != var:
            bad.append(f"I2 lane {lane.name}: reserved_var {lane.reserved_var} != sum of leased est_var {var}")
        if lane.reserved != est:
            bad.append(f"I2 lane {lane.name}: reserved {lane.reserved} != sum of leased estimates {est}")
        if lane.leased != n:
            bad.append(f"I2 lane {lane.name}: leased counter {lane.leased} != {n} leased jobs")
        spent, overage = cur.one(
            queries.AUDIT_SPENT_SINCE,
            {"l": lane.name, "p": lane.period_start},
        )
        if lane.spent != spent:
            bad.append(f"I3 lane {lane.name}: spent {lane.spent} != sum of settlements {spent}")
        if lane.overage != overage:
            bad.append(f"I1 lane {lane.name}: overage {lane.overage} != sum of settlement overage {overage}")
        within = lane.spent - lane.overage + lane.reserved
        if within > lane.ceiling:
            bad.append(
                f"I1 lane {lane.name}: admitted {within} (spent - overage + reserved) > ceiling {lane.ceiling}"
                " (an overspend, or the ceiling was lowered below what was already admitted)"
            )
        if min(lane.spent, lane.reserved, lane.overage, lane.leased, lane.reserved_var) < 0:
            bad.append(f"counters of lane {lane.name} went negative")
        window, reserve = cur.one(
            queries.AUDIT_WINDOW_AND_FINISHING,
            {"l": lane.name},
        )
        if lane.window_used != window:
            bad.append(
                f"rate window of lane {lane.name}: window_used {lane.window_used} != sum of its charges {window}"
            )
        if lane.finishing != reserve:
            bad.append(
                f"finishing reserve of lane {lane.name}: {lane.finishing} != sum of its runs' reserves {reserve}"
            )
    for lane_name, unit, used, charged in cur.all(queries.AUDIT_LIMIT_USED):
        if used != charged:  # each limit's window is kept as the burst window is (lane_plugin.ledger.limits)
            bad.append(f"{unit} window of lane {lane_name}: used {used} != sum of its charges {charged}")
    bad += _tenants(cur)
    for job_id, lane, key, room, epoch in cur.all(queries.AUDIT_ROOMS):  # rule 12 (overtake.py)
        if room is None:
            bad.append(f"I7 job {job_id} in lane {lane}: numbered in epoch {epoch}, which has no counter")
        else:
            bad.append(f"I7 job {job_id} in lane {lane}: passed by {key - room} rate tokens, more than its key {key}")
    for job_id, lane, position, epoch in cur.all(queries.AUDIT_EPOCH_UNNUMBERED):
        bad.append(f"I7 job {job_id} in lane {lane}: in epoch {epoch} but not numbered (position {position})")
    for job_id, attempt, n in cur.all(queries.AUDIT_DOUBLE_SETTLEMENTS):
        bad.append(f"I4 job {job_id} attempt {attempt} settled {n} times")
    for job_id, actual, billed in cur.all(queries.AUDIT_ACTUAL_MISMATCH):
        bad.append(f"I5 job {job_id}: actual {actual} != sum of its settlements {billed}")
    bad += _attempts(cur)
    for job_id, attempt, lane, state in cur.all(queries.AUDIT_STRAY_PENDING_CHARGES):
        bad.append(
            f"rate window of lane {lane}: job {job_id} attempt {attempt} is {state or 'missing'} but its "
            "charge is still pending (never picked up, never dropped: it would hold the window forever)"
        )
    orphan = cur.all(queries.AUDIT_ORPHAN_SETTLEMENTS)
    for (job_id,) in orphan:
        bad.append(f"I5 settlement for unknown job {job_id}")
    for (job_id,) in cur.all(queries.AUDIT_PARKED_WITHOUT_TAIL):
        bad.append(f"I6 parked job {job_id} has no tail entry with a deadline")
    for job_id, state in cur.all(queries.AUDIT_TAIL_NOT_PARKED):
        bad.append(f"I6 tail entry {job_id} is for a job that is {state or 'missing'}")
    for job_id, until in cur.all(
        queries.AUDIT_EXPIRED_LEASES,
        {"cut": now - grace},
    ):
        bad.append(f"lease of job {job_id} held {now - until:.0f}s past its expiry (reap interval {grace:.0f}s)")
    for job_id, lane, ahead, lease_seconds in leases.too_far_ahead(cur, now):
        bad.append(
            f"lease of job {job_id} ends {ahead:.0f}s from now, further ahead than lane {lane}'s lease_seconds "
            f"({lease_seconds:g}s) allows: set on a clock that has since gone back (the next reap pulls it back)"
        )
    return bad


def _tenants(cur: Cursor) -> list[str]:
    """I1 and I3 per tenant of a lane: its ``spent`` is the sum of its settlements in its period, and with a
    ceiling, ``spent - overage + reserved`` (what admission let in) stays under it."""
    bad: list[str] = []
    for lane, name, spent, ceiling, since in cur.all(queries.AUDIT_TENANTS):
        billed, overage, reserved = cur.one(
            queries.AUDIT_TENANT_SPEND,
            {"l": lane, "t": name, "p": since},
        )
        if spent != billed:
            bad.append(f"I3 tenant {name} of lane {lane}: spent {spent} != sum of its settlements {billed}")
        if ceiling is not None and spent - overage + reserved > ceiling:
            bad.append(
                f"I1 tenant {name} of lane {lane}: admitted {spent - overage + reserved} (spent - overage + "
                f"reserved) > its ceiling {ceiling} (an overspend, or the ceiling was lowered below it)"
            )
        if spent < 0:
            bad.append(f"counters of tenant {name} of lane {lane} went negative")
    return bad


def _attempts(cur: Cursor) -> list[str]:
    """Settlements agree with the attempts they bill, and job states with their leases."""
    bad: list[str] = []
    for job_id, attempt, leased_up_to in cur.all(queries.AUDIT_ATTEMPT_OUT_OF_RANGE):
        bad.append(f"I4 job {job_id}: attempt {attempt} is billed but was never leased (leased up to {leased_up_to})")
    for job_id, attempt, est, actual, overage, late, job_est in cur.all(
        queries.AUDIT_SETTLEMENT_SPLIT_WRONG,
        {"t": True, "f": False},
    ):
        kind = "late" if late else "live"
        bad.append(
            f"I1 job {job_id} attempt {attempt}: {kind} settlement of {actual} records est {est} and overage "
            f"{overage} (job estimate {job_est}): overage is hidden or invented"
        )
    for (job_id,) in cur.all(
        queries.AUDIT_DONE_UNSETTLED,
        {"f": False},
    ):
        bad.append(f"I3 job {job_id} is done but its attempt has no settlement")
    for job_id, attempt, lease_attempt, token in cur.all(queries.AUDIT_LEASE_INCONSISTENT):
        bad.append(
            f"I2 job {job_id} is leased but attempt {attempt} is already settled, or the lease is not its own "
            f"(leased attempt {lease_attempt}, token {'set' if token else 'missing'})"
        )
    for what, (sql) in (
        ("job", queries.AUDIT_JOBS_WITHOUT_LANE),
        ("settlement", queries.AUDIT_SETTLEMENTS_WITHOUT_LANE),
    ):
        for ident, lane in cur.all(sql):
            bad.append(f"I3 {what} {ident} is in lane {lane!r}, which does not exist: its tokens count nowhere")
    return bad
