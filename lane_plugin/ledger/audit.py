"""The ledger's invariants (I1-I6, docs/architecture.md), checked from the tables alone."""

from __future__ import annotations

from . import leases
from .db import Cursor
from .lanes import all_lanes


def audit(cur: Cursor, now: float, *, grace: float = 60.0) -> list[str]:
    """Return one line per violation; an empty list means the ledger is sound.

    ``grace`` is the reap interval: a lease may be held past its expiry until
    the next reap, but not longer.
    """
    bad: list[str] = []
    leased = {
        r[0]: (r[1], r[2], r[3])
        for r in cur.all(
            "select lane, count(*), coalesce(sum(est), 0), coalesce(sum(est_var), 0) from job "
            "where state = 'leased' group by lane"
        )  # fmt: skip
    }
    for lane in all_lanes(cur):
        n, est, var = leased.get(lane.name, (0, 0, 0))
        if lane.reserved_var != var:
            bad.append(f"I2 lane {lane.name}: reserved_var {lane.reserved_var} != sum of leased est_var {var}")
        if lane.reserved != est:
            bad.append(f"I2 lane {lane.name}: reserved {lane.reserved} != sum of leased estimates {est}")
        if lane.leased != n:
            bad.append(f"I2 lane {lane.name}: leased counter {lane.leased} != {n} leased jobs")
        spent, overage = cur.one(
            "select coalesce(sum(actual), 0), coalesce(sum(overage), 0) from settlement "
            "where lane = :l and settled_at >= :p",
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
            "select (select coalesce(sum(cost), 0) from rate_charge where lane = :l), (select coalesce(sum(remaining), "
            "0) from lane_run where lane = :l and expires_at is not null)",
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
    for lane_name, unit, used, charged in cur.all(
        "select l.lane, l.unit, l.used, coalesce((select sum(c.cost) from limit_charge c where c.lane = l.lane "
        "and c.unit = l.unit), 0) from lane_limit l"
    ):
        if used != charged:  # each limit's window is kept as the burst window is (lane_plugin.ledger.limits)
            bad.append(f"{unit} window of lane {lane_name}: used {used} != sum of its charges {charged}")
    bad += _tenants(cur)
    for job_id, attempt, n in cur.all(
        "select job_id, attempt, count(*) from settlement group by job_id, attempt having count(*) > 1"
    ):
        bad.append(f"I4 job {job_id} attempt {attempt} settled {n} times")
    for job_id, actual, billed in cur.all(
        "select j.id, j.actual, coalesce(s.total, 0) from job j left join (select job_id, sum(actual) as total "
        "from settlement group by job_id) s on s.job_id = j.id where j.actual != coalesce(s.total, 0) limit 20"
    ):
        bad.append(f"I5 job {job_id}: actual {actual} != sum of its settlements {billed}")
    bad += _attempts(cur)
    for job_id, attempt, lane, state in cur.all(
        "select c.job_id, c.attempt, c.lane, j.state from rate_charge c left join job j on j.id = c.job_id "
        "where not c.sent and (j.id is null or j.state != 'leased' or j.attempt != c.attempt) limit 20"
    ):
        bad.append(
            f"rate window of lane {lane}: job {job_id} attempt {attempt} is {state or 'missing'} but its "
            "charge is still pending (never picked up, never dropped: it would hold the window forever)"
        )
    orphan = cur.all("select s.job_id from settlement s left join job j on j.id = s.job_id where j.id is null limit 5")
    for (job_id,) in orphan:
        bad.append(f"I5 settlement for unknown job {job_id}")
    for (job_id,) in cur.all(
        "select j.id from job j left join tail t on t.job_id = j.id where j.state = 'parked' "
        "and (t.job_id is null or t.deadline is null) limit 20"
    ):
        bad.append(f"I6 parked job {job_id} has no tail entry with a deadline")
    for job_id, state in cur.all(
        "select t.job_id, j.state from tail t left join job j on j.id = t.job_id "
        "where j.state is null or j.state != 'parked' limit 20"
    ):
        bad.append(f"I6 tail entry {job_id} is for a job that is {state or 'missing'}")
    for job_id, until in cur.all(
        "select id, lease_until from job where state = 'leased' and lease_until < :cut limit 20",
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
    for lane, name, spent, ceiling, since in cur.all("select lane, name, spent, ceiling, period_start from tenant"):
        billed, overage, reserved = cur.one(
            "select coalesce(sum(s.actual), 0), coalesce(sum(s.overage), 0), (select coalesce(sum(est), 0) from job "
            "where lane = :l and tenant = :t and state = 'leased') from settlement s join job j on j.id = s.job_id "
            "where s.lane = :l and j.tenant = :t and s.settled_at >= :p",
            {"l": lane, "t": name, "p": since},
        )  # fmt: skip
        if spent != billed:
            bad.append(f"I3 tenant {name} of lane {lane}: spent {spent} != sum of its settlements {billed}")
        if ceiling is not None and spent - overage + reserved > ceiling:
            bad.append(f"I1 tenant {name} of lane {lane}: admitted {spent - overage + reserved} (spent - overage + "
                       f"reserved) > its ceiling {ceiling} (an overspend, or the ceiling was lowered below it)")  # fmt: skip
        if spent < 0:
            bad.append(f"counters of tenant {name} of lane {lane} went negative")
    return bad


def _attempts(cur: Cursor) -> list[str]:
    """Settlements agree with the attempts they bill, and job states with their leases."""
    bad: list[str] = []
    for job_id, attempt, leased_up_to in cur.all(
        "select s.job_id, s.attempt, j.lease_attempt from settlement s join job j on j.id = s.job_id "
        "where s.attempt < 1 or s.attempt > j.lease_attempt limit 20"
    ):
        bad.append(f"I4 job {job_id}: attempt {attempt} is billed but was never leased (leased up to {leased_up_to})")
    for job_id, attempt, est, actual, overage, late, job_est in cur.all(
        "select s.job_id, s.attempt, s.est, s.actual, s.overage, s.late, j.est from settlement s "
        "join job j on j.id = s.job_id where (s.late = :f and (s.est != j.est or s.overage != "
        "case when s.actual > j.est then s.actual - j.est else 0 end)) "
        "or (s.late = :t and (s.est != 0 or s.overage != s.actual)) limit 20",
        {"t": True, "f": False},
    ):
        kind = "late" if late else "live"
        bad.append(
            f"I1 job {job_id} attempt {attempt}: {kind} settlement of {actual} records est {est} and overage "
            f"{overage} (job estimate {job_est}): overage is hidden or invented"
        )
    for (job_id,) in cur.all(
        "select j.id from job j left join settlement s on s.job_id = j.id and s.attempt = j.attempt "
        "and s.late = :f where j.state = 'done' and s.job_id is null limit 20",
        {"f": False},
    ):
        bad.append(f"I3 job {job_id} is done but its attempt has no settlement")
    for job_id, attempt, lease_attempt, token in cur.all(
        "select j.id, j.attempt, j.lease_attempt, j.lease_token from job j left join settlement s "
        "on s.job_id = j.id and s.attempt = j.attempt where j.state = 'leased' and "
        "(j.lease_token is null or j.lease_attempt != j.attempt or s.job_id is not null) limit 20"
    ):
        bad.append(
            f"I2 job {job_id} is leased but attempt {attempt} is already settled, or the lease is not its own "
            f"(leased attempt {lease_attempt}, token {'set' if token else 'missing'})"
        )
    for what, (sql) in (
        ("job", "select j.id, j.lane from job j left join lane l on l.name = j.lane where l.name is null limit 20"),
        ("settlement", "select s.job_id, s.lane from settlement s left join lane l on l.name = s.lane "
                       "where l.name is null limit 20"),
    ):  # fmt: skip
        for ident, lane in cur.all(sql):
            bad.append(f"I3 {what} {ident} is in lane {lane!r}, which does not exist: its tokens count nowhere")
    return bad
