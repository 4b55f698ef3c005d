"""The rules one job is checked against at admission: why it is kept out now, until the next reset, or for ever.

Pure functions (no database, no clock): rules 1-6 and 9 of :mod:`lane_plugin.policy.admission`
(:func:`blocking_rule`, :func:`unfit_before_reset`), which :func:`lane_plugin.policy.admit` applies in
priority order, and rule 10 (:func:`never_fits`), checked at intake. The reasons are stable strings:
the gate logs them, the CLI prints them and tests compare them.
"""

from __future__ import annotations

from .candidate import FINISH, START, Candidate
from .drift import DRIFT_CAP_FRACTION, capped, drift_cap, over_charge
from .lane import LanePolicy
from .limits import format_limit, never_passes, units_of

# Reasons a job is not admitted, in rule order.
STOPPED = "stopped"
LEASE_CAP = "lease_cap"
CEILING = "ceiling"
DRIFT = "drift"
HEADROOM = "headroom"
RESERVE = "reserve"
START_LIMIT = "start_limit"
BURST = "burst"
# A job its tenant's budget keeps out (lane_plugin.policy.fairness): it holds no shadow, blocks no other tenant.
TENANT_CEILING = "tenant_ceiling"
# Rule 12: the overtaking budget (lane_plugin.policy.overtake) keeps a younger job from passing the older ones.
OVERTAKE = "overtake"
# Rule 1b: a provider's 429 closed the lane until its retry-after (lane.paused_until).
PAUSED = "paused"
# Rule 6b: "limit:requests", "limit:input_tokens", ...: the limit over that unit is full (policy.limits).
LIMIT_PREFIX = "limit:"
# drift.capped's 5% as an integer percentage (floor(ceiling * 5 / 100)).
_CAP_PERCENT = round(DRIFT_CAP_FRACTION * 100)


def blocking_rule(
    policy: LanePolicy,
    *,
    est: int,
    kind: str,
    committed: int,
    leased: int,
    window_used: int,
    rate_cost: int | None = None,
    finishing: int = 0,
    need: int | None = None,
    stopped: bool = False,
    var: int = 0,
    over: int = 0,
) -> str | None:
    """The first rule that keeps a job out, or None if it fits.

    ``committed`` is ``spent + reserved`` and ``finishing`` the reserve of the
    runs under way (each plus any shadow); ``need`` what the job adds to that
    reserve-inclusive total (``est`` plus its run's expected rest for a starting
    job; default ``est``); ``var`` the summed variance in flight with the job
    (:meth:`lane_plugin.policy.LanePolicy.headroom`); ``over`` the drift allowance of what is in
    flight with the job (:func:`lane_plugin.policy.drift.over_charge` of its ``reserved + est`` and jobs),
    capped here (:func:`lane_plugin.policy.drift.capped`: at most 5% of the ceiling and
    what the ceiling leaves the job).
    """
    if stopped:
        return STOPPED
    return _rule(
        policy,
        est,
        kind,
        committed,
        leased,
        window_used,
        est if rate_cost is None else rate_cost,
        finishing,
        est if need is None else need,
        var,
        over,
    )


def _rule(
    policy: LanePolicy,
    est: int,
    kind: str,
    committed: int,
    leased: int,
    window_used: int,
    rate_cost: int,
    finishing: int,
    need: int,
    var: int,
    over: int = 0,
) -> str | None:
    """:func:`blocking_rule` of a lane not stopped, every argument given (positional: admit calls it per candidate)."""
    if leased + 1 > policy.max_leased:
        return LEASE_CAP
    ceiling = policy.ceiling
    if committed + est > ceiling:
        return CEILING
    if over:  # drift.capped, inlined (it runs per candidate)
        over = min(over, ceiling * _CAP_PERCENT // 100, ceiling - est)  # est <= committed + est <= ceiling
    if over and committed + est + over > policy.ceiling:
        return DRIFT
    room = policy.ceiling - policy.headroom(var) - over
    if committed + est > room:
        return HEADROOM
    if kind != FINISH and committed + finishing + need > room:
        return RESERVE
    if kind == START and committed + est > policy.start_limit:
        return START_LIMIT
    if window_used + rate_cost > policy.burst_tokens:
        return BURST
    return None


def unfit_before_reset(
    policy: LanePolicy,
    c: Candidate,
    kind: str,
    *,
    spent: int,
    need: int,
    drift: float = 1.0,
    overrun: int = 0,
    spread: int = 0,
) -> tuple[str, str] | None:
    """``(rule, reason)`` if the job cannot fit until ``spent`` resets, else None.

    Leased work settling and runs under way finishing free everything but
    ``spent``; the rate window always slides. So a job cannot fit before the
    next reset only if ``spent`` alone already leaves no room for it (with its
    own headroom and drift allowance: :func:`blocking_rule` with nothing in flight).
    The allowance is capped (:func:`lane_plugin.policy.drift.capped`): a job whose estimate
    fits the empty lane is never kept out of it by the allowance alone.
    """
    left = policy.ceiling - spent
    own = policy.headroom(c.var)
    learned = over_charge(drift, overrun, spread, c.est, 1)
    over = capped(learned, policy.ceiling, c.est)
    if policy.limits:
        units = c.units
        for unit, lim in policy.limits:
            if units[unit] > lim.amount:
                return LIMIT_PREFIX + unit, f"{unit} {units[unit]} exceeds the limit {format_limit((unit, lim))}"
    if c.rate > policy.burst_tokens:
        return BURST, (
            f"rate cost {c.rate} exceeds the lane's burst of {policy.burst_tokens} tokens "
            f"per {policy.window_seconds:g}s window"
        )
    if c.est > left:
        return (
            CEILING,
            f"estimate {c.est} exceeds what is left of the ceiling: {left} of {policy.ceiling} (spent {spent})",
        )
    if over and c.est + over > left:
        cap = (
            f"; capped from {learned}: at most {DRIFT_CAP_FRACTION:.0%} of the ceiling "
            f"({drift_cap(policy.ceiling)}) and what the ceiling leaves the job"
            if over < learned
            else ""
        )
        return DRIFT, (
            f"estimate {c.est} plus {over} tokens of drift allowance (settled work ran {drift:g}x its "
            f"estimates, one {overrun} past{cap}) exceeds what is left of the ceiling: {left} of "
            f"{policy.ceiling} (spent {spent})"
        )
    if c.est + own + over > left:
        also = f" and {over} of drift allowance" if over else ""
        return HEADROOM, (
            f"estimate {c.est} plus {own} tokens of headroom for its spread{also} exceeds what is left "
            f"of the ceiling: {left} of {policy.ceiling} (spent {spent})"
        )
    if kind == START and spent + c.est > policy.start_limit:
        return START_LIMIT, (
            f"estimate {c.est} would start a run past the start limit {policy.start_limit} "
            f"({policy.start_fraction:.0%} of the ceiling {policy.ceiling}; spent {spent})"
        )
    if kind != FINISH and need + own + over > left:
        return RESERVE, (
            f"its run is expected to need {need} tokens ({c.est} now, {need - c.est} to finish) "
            f"but {left} of the ceiling {policy.ceiling} is left (spent {spent})"
        )
    return None


def never_fits(
    policy: LanePolicy,
    est: int,
    *,
    starts_run: bool = True,
    rate_cost: int | None = None,
    var: int = 0,
    input_cost: int | None = None,
    output_cost: int | None = None,
) -> str | None:
    """Why a job could never be admitted in this lane, or None (rule 10).

    Checked at intake so that such a job is refused (or routed to a fallback
    lane) at once instead of waiting for ever. ``input_cost`` / ``output_cost``: its units for the
    lane's limits (:func:`lane_plugin.policy.limits.never_passes`).

    Example:
        >>> p = LanePolicy(ceiling=1_000, burst_tokens=500)
        >>> never_fits(p, 400) is None, never_fits(p, 600)
        (True, "estimate 600 exceeds the lane's burst of 500 tokens per window")
    """
    rate_cost = est if rate_cost is None else rate_cost
    if policy.limits:
        why = never_passes(policy.limits, units_of(rate_cost, input_cost, output_cost))
        if why is not None:
            return why
    if rate_cost > policy.burst_tokens:
        what = "estimate" if rate_cost == est else "rate cost"
        return f"{what} {rate_cost} exceeds the lane's burst of {policy.burst_tokens} tokens per window"
    if est > policy.ceiling:
        return f"estimate {est} exceeds the lane's ceiling of {policy.ceiling}"
    if est + policy.headroom(var) > policy.ceiling:
        return (
            f"estimate {est} plus {policy.headroom(var)} tokens of headroom for its spread exceeds the lane's "
            f"ceiling of {policy.ceiling}"
        )
    if starts_run and est > policy.start_limit:
        return (
            f"estimate {est} exceeds the lane's start limit of {policy.start_limit} "
            f"({policy.start_fraction:.0%} of the ceiling {policy.ceiling})"
        )
    return None
