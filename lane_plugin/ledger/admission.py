"""Admission: one tick leases what fits in a lane; a running holder renews its lease.

Each function runs inside one transaction (see :mod:`lane_plugin.ledger.db`) and
takes the lane row's lock first (``BEGIN IMMEDIATE`` on SQLite, ``FOR UPDATE``
on PostgreSQL), so every write that moves a lane's counters is serialised per
lane and the order of locks is always lane, then job. The budget is re-checked
by a conditional UPDATE even though the lock already guarantees it: a bug in
the policy must fail the transaction, never overspend.
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import LaneError, LeaseLost, UnknownJob
from ..policy import Candidate, Decision, LaneSnapshot, admit
from ..policy.admission import HEAD_SLACK
from ..policy.fairness import NO_RESET_HELPS
from ..policy.reserve import REFIT_SECONDS
from ..policy.rules import BURST, LEASE_CAP, PAUSED, STOPPED, TENANT_CEILING
from . import limits, overtake, queries, rates, runs, tenants, upkeep, waiters
from .db import Cursor
from .jobs import Lease
from .lanes import LaneRow, lock_lane
from .periods import roll_counters
from .queries import GATED_HEAD_SQL, TENANT_HEADS, WAITERS_HEAD_SQL, WAITERS_HEAD_SQLITE
from .queries import HEAD_SQL as HEAD_SQL


class Ticked(NamedTuple):
    """What one tick did: the leases, the policy's decision, the lane row as the tick read it (before its
    admissions), whether the lane's profile is due for a refit, the tail entries of the jobs it parked, and
    ``retry_in``: seconds until the window has room for a job it left blocked by the burst window."""

    leases: list[Lease]
    decision: Decision
    row: LaneRow
    refit_due: bool
    parked: list[dict]
    retry_in: float | None = None


# A hand-off with no gated job waiting returns at once (False: it runs on as a tick; tests compare the two).
SKIP_EMPTY_HANDOFF = True


def tick(
    cur: Cursor,
    lane: str,
    *,
    now: float,
    token: str,
    head_extra: int = HEAD_SLACK,
    handoff: bool = False,
    row: LaneRow | None = None,
    send_slack: float | None = 0.0,
    holder: str | None = None,
    gated: bool = False,
    own: str | None = None,
) -> Ticked | None:
    """Lease what fits in ``lane`` now.

    Returns a :class:`Ticked`: ``parked`` the tail entries of the jobs this tick parked because they
    cannot fit before the next reset (with their ``rule``), or because their waiter is gone;
    ``retry_in`` the seconds until the burst window has slid far enough for a job it left blocked
    (None if none waits on the window). ``gated``: a tick whose caller runs no job but its own (a gate's,
    the waiters' watcher, :meth:`~lane_plugin.Ledger.acquire` with ``own`` its job): it leases only jobs
    a waiter waits for, who picks the lease up from the job row, and ``own``. A job nobody waits for
    (``lane submit``: pulled by whoever runs ``lane tick``) is not read at all, so it is neither leased
    to a process that drops the lease (each such lease expired unrun and cost the job an attempt: after
    ``max_attempts`` it was parked) nor holds room the gated jobs behind it could use: an explicit tick
    leases it in its place in the order. ``handoff``: a settlement or a reap handing its room on, in its
    own transaction: a ``gated`` tick that parks nothing, and returns None when no gated job waits (no window
    slid, no reserve lapsed; a reap's, given no ``row``, has locked the lane and rolled its period, as any writer). ``row``: the lane's row, locked and rolled by this transaction and
    as it last wrote it (a settlement's hand-off), so the tick does not read it again. ``send_slack``:
    the admitted jobs' rate charges are placed that many seconds after ``now`` (None: the default, at
    most 5% of the lane's window, :func:`rates.slack_for`; the ledger's
    ``send_slack``: when their requests may reach the provider). ``holder``: the ticking process's waiter
    id; a lease of a job with no waiter, or of ``holder``'s, goes to the caller (its charge is sent now), one
    of another waiter's is handed on, its charge pending until that waiter picks it up (:mod:`.rates`).
    """
    row = roll_counters(cur, lock_lane(cur, lane), now) if row is None else row
    if row.overtake_slack is not None:  # rule 12: the jobs entered since the last tick get their places first
        overtake.number(cur, lane, slack=row.overtake_slack, q=row.overtake_q)
    free_slots = row.max_leased - row.leased
    gated = gated or handoff
    if not gated:
        head_sql = HEAD_SQL
    elif own is not None:
        head_sql = GATED_HEAD_SQL
    else:
        head_sql = WAITERS_HEAD_SQLITE if cur.dialect == "sqlite" else WAITERS_HEAD_SQL
    head_params = {"l": lane, "k": max(free_slots, 0) + head_extra, "f": False, "t": True, "own": own}
    head = None
    # The lane's tenants (a small table): with one (or none), the lane's own head; with several, each one's.
    tenant_rows = tenants.of_lane(cur, lane, now)
    several = len(tenant_rows) > 1
    if handoff:
        # Read the gated head first (one read of ix_job_gated): with none waiting the hand-off could lease
        # nothing and park nothing, and the slide and lapse below are every tick's first step anyway.
        head = _read_head(cur, head_sql, head_params, tenant_rows if several else None)
        if not head and SKIP_EMPTY_HANDOFF:
            return None
    rates.slide(cur, row, now)
    uses = limits.slide(cur, row, now) if row.limit_spec else ()
    if row.finishing:  # only a reserve can lapse; refit lapses quiet runs itself before it reads them
        runs.lapse(cur, row, now)
    refit_due = now - row.profile_at >= REFIT_SECONDS
    if row.held or free_slots <= 0:
        held = Decision((), 0, head_reason=STOPPED if row.held else LEASE_CAP)
        return Ticked([], held, row, refit_due, [])
    if row.paused_until is not None and now < row.paused_until:  # the provider's word (rule 1b)
        return Ticked([], Decision((), 0, head_reason=PAUSED), row, refit_due, [], row.paused_until - now)
    if head is None:
        head = _read_head(cur, head_sql, head_params, tenant_rows if several else None)
    # Rule 12's rooms, read on demand. Not on a lane's learning day (no Q yet): every key is unbounded, so no room
    # holds a pass back, and the first Q learned numbers every waiting job afresh, so nothing charged now is kept.
    binds = row.overtake_slack is not None and row.overtake_q is not None
    rooms = overtake.Rooms(cur, lane) if binds else None
    exempt: frozenset[str] = frozenset()
    if rooms is not None:
        oldest = rooms.oldest(k=head_params["k"], burst=row.burst_tokens, head=head)
        rooms.known(oldest)
        if gated:  # a job nobody waits for is not this tick's to lease: its room does not bind it (perjob)
            exempt = frozenset(r[0] for r in oldest if r[9] is None and r[0] != own)
            oldest = [r for r in oldest if r[0] not in exempt]
        head += oldest
        rooms.known(head)
    gone_tails: list[dict] = []
    gone = waiters.gone(cur, {r[9] for r in head if r[9] is not None}, now) if any(r[9] for r in head) else set()
    if gone:  # their jobs leave admission at once, never leased to nobody
        gone_tails = upkeep.drop_waiters(
            cur, gone, now=now, lane=lane, why=f"{waiters.WAITER_GONE}: not seen for {waiters.GONE_SECONDS:g}s"
        )
        head = [r for r in head if r[9] not in gone]
    if not head:
        return Ticked([], Decision((), 0), row, refit_due, gone_tails)
    rows = {r[0]: r for r in head}
    remaining = runs.runs_of(cur, lane, sorted({r[3] for r in head if r[3] is not None}))
    fits = runs.fits_of(cur, lane, sorted({r[4] for r in head if r[3] is not None}))
    cands = [
        Candidate(
            r[0],
            r[1],
            r[2],
            r[3],
            r[6],
            r[4],
            fits[r[4]].after if r[3] is not None and r[4] in fits else 0,
            r[7],
            r[8],
            r[10],
            r[11],
            r[12],
        )
        for r in head
    ]
    # Several tenants: returning ones lifted, counters and budgets for the fair order (rule 11); one with a
    # budget: that budget. One tenant with none (the common case): nothing more to read or write.
    fair = several or any(r.ceiling is not None for r in tenant_rows.values())
    tenant_states = (
        tenants.states(cur, lane, tenant_rows, {r[10] for r in head} if several else set(tenant_rows), now)
        if fair
        else {}
    )
    snapshot = LaneSnapshot(
        policy=row.policy,
        spent=row.spent,
        reserved=row.reserved,
        leased=row.leased,
        window_used=row.window_used,
        now=now,
        started_runs=frozenset(remaining),
        finishing=row.finishing,
        run_remaining=remaining,
        resets=row.period != "none",
        reserved_var=row.reserved_var,
        drift=row.drift,
        overrun=row.drift_overrun,
        spread=row.drift_spread,
        tenants=tenant_states,
        limits=uses,
        paused_until=row.paused_until,
        rooms=rooms,
        exempt=exempt,
    )
    decision = admit(snapshot, cands)
    unfit = () if handoff else decision.parked  # a hand-off only leases; parking the unfit is a tick's
    parked = gone_tails + [t for t in (_give_up(cur, row, c.id, rule, why, now) for c, rule, why in unfit) if t]
    if not decision.admitted:
        return Ticked([], decision, row, refit_due, parked, _retry_in(cur, row, decision, now, uses))
    n, tokens = len(decision.admitted), decision.tokens
    lease_until = now + row.lease_seconds
    charges = [(c.id, rows[c.id][5], c.rate, rows[c.id][9] in (None, holder)) for c in decision.admitted]
    slack = rates.slack_for(send_slack, row.window_seconds)
    params = {
        "t": tokens,
        "n": n,
        "r": decision.rate,
        "fd": decision.finishing,
        "v": decision.var,
        "now": now,
        "l": lane,
        "lu": lease_until,
        "tok": token,
    }
    if cur.dialect == "postgresql":  # the lane, the jobs, the rate charges and the NOTIFY: one round trip
        counted, leased, _ = cur.one(
            queries.ADMISSION_LEASE_PG,
            {
                **params,
                "ids": decision.ids,
                "js": [x[0] for x in charges],
                "atts": [x[1] for x in charges],
                "cs": [x[2] for x in charges],
                "ss": [x[3] for x in charges],
                "ch": waiters.CHANNEL,
                "what": waiters.leased_what(lane, decision.ids),
                "at": now + slack,
            },
        )
        if counted != 1:
            raise LaneError(f"admission re-check failed in lane {lane!r}: the policy chose past the ceiling")
        if leased != n:
            raise LaneError(f"admission in lane {lane!r} lost a race it cannot lose (lock not held?)")
    else:
        cur.execute(queries.ADMISSION_LANE_UPDATE, params)
        if cur.rowcount != 1:
            raise LaneError(f"admission re-check failed in lane {lane!r}: the policy chose past the ceiling")
        for job_id in decision.ids:
            # One primary-key update per job: with "id in (...) and state = 'new'" SQLite's planner
            # picks the state index and walks every waiting job.
            cur.execute(queries.ADMISSION_LEASE_ONE, {**params, "id": job_id})
            if cur.rowcount != 1:
                raise LaneError(f"admission in lane {lane!r} lost a race it cannot lose (lock not held?)")
        rates.charge(cur, lane, now + slack, charges)  # (no NOTIFY on SQLite: its waiters read their own rows)
    if uses:
        limits.charge(
            cur,
            lane,
            now + slack,
            [(c.id, rows[c.id][5], c.units, rows[c.id][9] in (None, holder)) for c in decision.admitted],
            decision.units,
        )
    if rooms is not None:  # what they passed, now that they no longer wait (less what held jobs are given back)
        charged = [(c.id, c.rate) for c in decision.admitted if c.id not in decision.uncharged]
        overtake.passed(cur, lane, rooms, charged, decision.exempt)
    if decision.runs:
        runs.record(cur, row, now, decision, fits, set(remaining))
    if fair:
        tenants.charge(cur, lane, tenant_rows, decision.by_tenant, tenant_states, now)
    leases = [
        Lease(c.id, lane, c.stage, c.est, rows[c.id][5], token, lease_until, c.run_key, c.rate, c.tenant)
        for c in decision.admitted
    ]
    return Ticked(leases, decision, row, refit_due, parked, _retry_in(cur, row, decision, now, uses))


def _read_head(cur: Cursor, head_sql: str, params: dict, tenant_rows: dict | None) -> list:
    """The head of the lane's queue: of the lane's index, or (``tenant_rows``: several tenants) of each tenant's."""
    if tenant_rows is None:
        return cur.all(head_sql, params)
    sql = TENANT_HEADS[head_sql]
    return [r for name in sorted(tenant_rows) for r in cur.all(sql, {**params, "tn": name})]


def _retry_in(cur: Cursor, row: LaneRow, decision: Decision, now: float, uses: tuple = ()) -> float | None:
    """Seconds from ``now`` until a window (the burst window's, or a limit's) has slid far enough for the
    job it blocked (the soonest of them: the tick then asks again)."""
    times = []
    if decision.burst_need is not None:
        times.append(rates.free_at(cur, row, row.window_used + decision.rate, decision.burst_need))
    if decision.limit_need:
        added, by_unit = dict(decision.units), {u.unit: u for u in uses}
        for unit, need in decision.limit_need:
            use = by_unit[unit]
            times.append(limits.free_at(cur, row.name, use, use.used + added.get(unit, 0), need))
    known = [t for t in times if t is not None]
    return None if not known else max(0.0, min(known) - now)


def _give_up(cur: Cursor, row: LaneRow, job_id: str, rule: str, why: str, now: float) -> dict | None:
    """A job that cannot fit before the next reset: to its fallback lane, or parked with the reason."""
    # (a rate cost past the burst can never fit, period or not: no reset lowers it)
    cause = (
        "which has no period to reset its spend"
        if rule != BURST and rule != TENANT_CEILING
        else "whatever its period resets"
        if rule == BURST or why.endswith(NO_RESET_HELPS)
        else "whose tenant has no period to reset its spend"
    )
    tail = upkeep.give_up(cur, job_id, reason=f"cannot fit in lane {row.name!r}, {cause}: {why}", now=now)
    return None if tail is None else {**tail, "rule": rule}


def renew(cur: Cursor, job_id: str, token: str, *, now: float) -> float:
    """Extend a held lease; raises :class:`LeaseLost` if it is no longer this holder's."""
    row = cur.one(
        queries.ADMISSION_RENEW_SELECT_JOB,
        {"id": job_id},
    )
    if row is None:
        raise UnknownJob(job_id)
    state, held, lease_seconds, _ = row
    if state != "leased" or held != token:
        raise LeaseLost(f"job {job_id} lost its lease (state {state})", job_id=job_id)
    until = now + lease_seconds
    cur.execute(
        queries.ADMISSION_RENEW_UPDATE_JOB,
        {"u": until, "id": job_id, "tok": token},
    )
    if cur.rowcount != 1:
        raise LeaseLost(f"job {job_id} lost its lease", job_id=job_id)
    return until
