"""Lane status: counters, remaining room and queue sizes, as people read them."""

from __future__ import annotations

from ..policy import Candidate
from ..policy.candidate import FINISH, START, kind_of
from ..policy.drift import DRIFT_SAMPLE, capped, drift_cap
from ..policy.limits import units_of
from ..policy.rules import LIMIT_PREFIX, PAUSED, TENANT_CEILING, blocking_rule, unfit_before_reset
from . import queries
from .db import Cursor
from .jobs import get_job
from .lanes import LaneRow, all_lanes, read_lane
from .limits import held_back, limit_status
from .periods import as_of
from .rates import used
from .runs import fits_of, runs_of

# A lane's state as people are told it, worst first (the first that holds is the state).
LANE_STATES = ("stopped", "preflight-failed", "ceiling-spent", "finishing-only", "ok")


def lane_state(row: LaneRow) -> str:
    """The lane's state in one word: see :data:`LANE_STATES`."""
    if row.stopped:
        return "stopped"
    if not row.preflight_ok:
        return "preflight-failed"
    if row.spent >= row.ceiling:
        return "ceiling-spent"
    if row.spent + row.reserved >= row.policy.start_limit:
        return "finishing-only"
    return "ok"


# A lane whose work parked or failed lately is never "ok": failed attempts are counted this far back.
FAILED_SPAN = 3600.0


def work_trouble(s: dict) -> str | None:
    """What is wrong with a lane's work (a :func:`lane_status` row), in words, or None.

    Example:
        >>> work_trouble({"parked": 2, "failed_last_hour": 1}), work_trouble({"parked": 0, "failed_last_hour": 0})
        ('2 parked, 1 failed attempt in the last hour', None)
    """
    parts = [f"{s['parked']} parked"] if s["parked"] else []
    n = s["failed_last_hour"]
    if n:
        parts.append(f"{n} failed attempt{'s' * (n != 1)} in the last hour")
    return ", ".join(parts) or None


def status_word(s: dict) -> str:
    """The lane's state as ``lane status`` and ``lane lanes`` say it (a :func:`lane_status` row).

    Its :func:`lane_state`; an ``ok`` lane whose first waiting job a rule keeps out while nothing is leased
    is ``blocked by RULE``; one with parked work, or attempts that failed in the last hour, is ``attention``:
    never ``ok``.
    """
    state = s["state"]
    if state == "ok":
        state = blocked_state(s) or state
    if state == "ok" and work_trouble(s):
        state = "attention"
    return state


def blocked_state(s: dict) -> str | None:
    """``blocked by RULE`` for a lane (a :func:`lane_status` row) whose first waiting job a rule keeps out while
    nothing is leased, so nothing in flight settles to make room; else None (its state is what it was)."""
    return f"blocked by {s['blocked_by']}" if s["blocked_by"] and not s["leased"] else None


def report_states(cur: Cursor, now: float, lane: str | None = None) -> list[dict]:
    """Lanes whose state changed since it was last reported; records the new state (lanes locked).

    A lane seen for the first time in state ``ok`` is recorded without a change:
    there is nothing to tell. Each change is returned once, to whichever caller
    records it first.
    """
    changes = []
    for row in all_lanes(cur, lock=True):
        if lane is not None and row.name != lane:
            continue
        row = as_of(row, now)  # a period that rolled since the last tick: today's state
        state = lane_state(row)
        previous = cur.scalar(queries.STATUS_REPORT_STATES_SELECT_LANE, {"n": row.name})
        if previous == state:
            continue
        cur.execute(queries.STATUS_REPORT_STATES_UPDATE_LANE, {"s": state, "n": row.name})
        if previous is None and state == "ok":
            continue
        changes.append(
            {
                "lane": row.name,
                "state": state,
                "previous": previous,
                "ceiling": row.ceiling,
                "start_limit": row.policy.start_limit,
                "start_fraction": row.start_fraction,
                "spent": row.spent,
                "reserved": row.reserved,
                "committed": row.spent + row.reserved,
                "overage": row.overage,
                "preflight_error": row.preflight_error,
            }
        )
    return changes


def lane_status(cur: Cursor, now: float) -> list[dict]:
    counts: dict[tuple[str, str], int] = {(r[0], r[1]): r[2] for r in cur.all(queries.STATUS_LANE_STATUS)}
    out = []
    for row in (as_of(r, now) for r in all_lanes(cur)):  # a period rolled since the last tick: today's numbers
        committed = row.spent + row.reserved
        waiting = counts.get((row.name, "new"), 0)
        head = head_status(cur, now, row.name) if waiting else None
        uses = limit_status(cur, row, now)
        out.append(
            {
                "lane": row.name,
                "state": lane_state(row),
                "allowance": row.allowance,
                "ceiling": row.ceiling,
                "spent": row.spent,
                "reserved": row.reserved,
                "remaining": row.ceiling - committed,
                "finishing": row.finishing,
                "reserved_var": row.reserved_var,
                "headroom": row.policy.headroom(row.reserved_var),
                "drift": row.drift,
                "drift_overrun": row.drift_overrun,
                "drift_spread": row.drift_spread,
                "drift_cleared_at": row.drift_cleared_at,  # lane lanes clear-drift: learned only from settlements after
                # What the allowance keeps free of what is in flight, capped (at most 5% of the ceiling).
                "drift_allowance": capped(row.over(row.reserved, row.leased), row.ceiling, 0) if row.leased else 0,
                "overage": row.overage,
                "pct_of_ceiling": round(100.0 * committed / row.ceiling, 2),
                "start_limit": row.policy.start_limit,
                "leased": row.leased,
                "max_leased": row.max_leased,
                "waiting": waiting,
                "parked": counts.get((row.name, "parked"), 0),
                "failed_last_hour": failed_lately(cur, row.name, now),
                "burst_tokens": row.burst_tokens,
                "window_seconds": row.window_seconds,
                "window_used": used(cur, row, now),
                # Every limit (tokens is the burst window) with what its window holds, and the provider's pause.
                "limits": [u["limit"] for u in uses],
                "limit_use": uses,
                "paused_until": row.paused_until if row.paused_until is not None and row.paused_until > now else None,
                "paused_reason": row.paused_reason if row.paused_until is not None and row.paused_until > now else None,
                "held_back": held_back(row, uses, now),
                "rate_basis": row.rate_basis,
                "start_fraction": row.start_fraction,
                "lease_seconds": row.lease_seconds,
                "max_wait_seconds": row.max_wait_seconds,
                # Rule 12 (overtake.py): the slack (None: off), the p99 of V its keys read (None: learning, nobody is
                # held back), and when it was turned on (it learns from a day of arrivals since).
                "overtake_slack": row.overtake_slack,
                "overtake_q": row.overtake_q,
                "overtake_since": row.overtake_since,
                "max_attempts": row.max_attempts,
                "fallback": row.fallback,
                "period": row.period,
                "stopped": row.stopped,
                "hard_stopped": row.hard_stopped,
                "starting_stopped": committed >= row.policy.start_limit,
                "preflight": row.preflight,
                "preflight_ok": row.preflight_ok,
                "preflight_error": row.preflight_error,
                "preflight_at": row.preflight_at,
                # Why work waits: the first waiting job's wait_status (its rule, and its reason in words
                # when it cannot fit before the next reset); None while it fits or nothing waits.
                "head_job": head["job_id"] if head else None,
                "blocked_by": head["blocked_by"] if head else None,
                "blocked_reason": head["reason"] if head else None,
            }
        )
    return out


def failed_lately(cur: Cursor, lane: str, now: float) -> int:
    """Attempts of the lane settled as failed (their body raised) in the last :data:`FAILED_SPAN` seconds.

    One range of ``ix_settlement_lane_at``: the lane's settlements of the last hour, not its history.
    """
    sql = queries.STATUS_FAILED_LATELY
    return int(cur.scalar(sql, {"l": lane, "t": now - FAILED_SPAN}) or 0)


def head_status(cur: Cursor, now: float, lane: str) -> dict | None:
    """:func:`wait_status` of the lane's first waiting job in admission order, or None if none waits.

    What keeps a lane's work waiting, in the words ``lane status JOB`` uses for one job: the same rules
    (:func:`lane_plugin.policy.rules.blocking_rule`, :func:`lane_plugin.policy.rules.unfit_before_reset`), not a second reading.
    """
    # the head of each range of ix_job_queue, as admission reads it (with the jobs rule 12 has yet to number); the
    # first of the two in (prio, id) order
    heads = cur.all(queries.STATUS_HEAD_SQL, {"l": lane, "f": False, "t": True, "k": 1})
    return None if not heads else wait_status(cur, now, min(heads, key=lambda h: (h[7], h[0]))[0])


def _when(row: LaneRow, c: Candidate, kind: str, need: int) -> str:
    """When a job unfit before the next reset may fit: parked without a period, after the reset if an empty lane holds it.

    The drift allowance does not reset with ``spent``, but it is capped (:func:`lane_plugin.policy.drift.capped`): it alone never keeps a
    job whose estimate fits the empty lane out of it. With the job's own headroom or its run's rest it still may.
    """
    if row.period == "none":
        return " (the lane has no period: the next tick parks it)"
    if (
        unfit_before_reset(
            row.policy, c, kind, spent=0, need=need, drift=row.drift, overrun=row.drift_overrun, spread=row.drift_spread
        )
        is None
    ):
        return " (until the period resets)"
    return (
        " (not even after the period resets: it does not fit the empty lane either; the drift allowance "
        f"changes only as jobs settle, learned from the latest {DRIFT_SAMPLE:,}, and keeps at most "
        f"{drift_cap(row.ceiling):,} free)"
    )


def _limit_block(cur: Cursor, row: LaneRow, now: float, c: Candidate, job: dict) -> tuple[str | None, str | None]:
    """The provider's pause (rule 1b) or the first full limit (rule 6b) keeping the job out, in words; or nothing."""
    if row.paused_until is not None and row.paused_until > now:
        return PAUSED, held_back(row, [], now)
    units = units_of(c.rate, job.get("rate_input"), job.get("rate_output"))
    for u in limit_status(cur, row, now):
        if u["unit"] != "tokens" and u["used"] + units[u["unit"]] > u["amount"]:
            return LIMIT_PREFIX + u["unit"], held_back(row, [{**u, "used": max(u["used"], u["amount"])}], now)
    return None, None


def wait_status(cur: Cursor, now: float, job_id: str) -> dict:
    """Where a waiting job stands: its place in admission order and the lane's room (Ledger.wait_status)."""
    job = get_job(cur, job_id)
    row = as_of(read_lane(cur, job["lane"]), now)
    prio, rate_cost, waiter, stored = cur.one(queries.STATUS_JOB_PLACE, {"id": job_id})
    p = {"l": row.name, "p": prio, "id": job_id}
    position = 0
    if job["state"] == "new":
        position = 1 + cur.scalar(queries.STATUS_WAITING_AHEAD, p)
    key = job["run_key"]
    started = runs_of(cur, row.name, [key] if key else [])
    fit = fits_of(cur, row.name, [job["stage"]]).get(job["stage"]) if key else None
    c = Candidate(job_id, job["est"], 0.0, key, rate_cost, job["stage"], fit.after if fit else 0, prio, job["est_var"])
    kind = kind_of(c, frozenset(started))
    need = c.est + (c.after if kind == START else 0)
    unfit = unfit_before_reset(
        row.policy,
        c,
        kind,
        spent=row.spent,
        need=need,
        drift=row.drift,
        overrun=row.drift_overrun,
        spread=row.drift_spread,
    )
    if unfit is not None:
        blocked_by, reason = unfit[0], unfit[1] + _when(row, c, kind, need)
    else:
        reason = None
        blocked_by = blocking_rule(
            row.policy,
            est=c.est,
            kind=kind,
            rate_cost=rate_cost,
            need=need,
            committed=row.spent + row.reserved,
            finishing=row.finishing,
            leased=row.leased,
            window_used=used(cur, row, now),
            stopped=row.held,
            var=row.reserved_var + c.var,
            over=row.over(row.reserved + c.est, row.leased + 1),
        )
    if job["state"] == "new" and unfit is None:  # its tenant's budget (rule 11): it blocks this job, no other
        budget = tenant_budget(cur, now, row.name, job["tenant"], job["est"])
        if budget is not None:
            blocked_by, reason = TENANT_CEILING, budget
    if blocked_by is None and job["state"] == "new" and (row.paused_until or row.limit_spec):
        blocked_by, reason = _limit_block(cur, row, now, c, job)
    if job["state"] in ("parked", "failed", "done"):  # left the queue: the reason the ledger recorded, if any
        reason = stored
    return {
        "job_id": job_id,
        "lane": row.name,
        "stage": job["stage"],
        "est": job["est"],
        "rate_cost": rate_cost,
        "state": job["state"],
        "position": position,
        "waiting": cur.scalar(queries.STATUS_WAITING, p),
        "remaining": row.remaining,
        "spent": row.spent,
        "reserved": row.reserved,
        "finishing": row.finishing,
        "ceiling": row.ceiling,
        "start_limit": row.policy.start_limit,
        "leased": row.leased,
        "max_leased": row.max_leased,
        "starts_run": kind != FINISH,
        "kind": kind,
        "blocked_by": blocked_by,
        "reason": reason,
        # a lease past its end is still 'leased' until the next reap takes it back (a tick reaps nothing); the
        # reap's own test, lease_until < now; a gated job's (a waiter waited for it) is parked, not requeued
        "attempt": job["attempt"],
        "lease_until": job["lease_until"] if job["state"] == "leased" else None,
        "lease_left": job["lease_until"] - now if job["state"] == "leased" else None,
        "lease_expired": job["state"] == "leased" and job["lease_until"] < now,
        "run_key": key,
        "gated": waiter is not None,
        "tenant": job["tenant"],
    }


def tenant_budget(cur: Cursor, now: float, lane: str, tenant: str, est: int) -> str | None:
    """Why a job of ``tenant`` does not fit its tenant's budget now, or None (no budget, or room for it)."""
    from .tenants import listing

    found = [t for t in listing(cur, now, lane) if t["tenant"] == tenant and t["ceiling"] is not None]
    if not found:
        return None
    t = found[0]
    room = t["ceiling"] - t["spent"] - t["reserved"]
    if est <= room:
        return None
    when = (
        f"until its {t['period']} period resets"
        if t["period"] != "none"
        else "for good unless its ceiling is raised (lane tenants set)"
        if t["spent"] + est > t["ceiling"]
        else "until its leased jobs settle"
    )
    return (
        f"the budget of tenant {tenant!r}: {max(room, 0):,} of its ceiling {t['ceiling']:,} left (spent "
        f"{t['spent']:,}, reserved {t['reserved']:,}): it waits {when}; the lane's other tenants are not held"
    )
