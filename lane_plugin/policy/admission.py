"""Admission: which waiting jobs a lane leases now (:func:`admit`), and the rules it applies in order.

Pure functions over plain values: no database, no Prefect, no clock. The store
feeds it a snapshot of one lane and the head of that lane's waiting queue and
applies the decision atomically; ``lane simulate`` feeds it a simulated clock.
Both run this very code, so what the simulator shows is what the ledger does.

Two currencies: a job charges the *budget* its estimate ``est`` (settled to the
bill) and the provider's *rate limiter* its ``rate_cost`` (what the provider
counts at request time, e.g. prompt + max_tokens; default ``est``). A
*finishing* job's run already has an admitted job in the lane, a *starting*
job's run has none, a *free* job has no run (:mod:`lane_plugin.policy.candidate`). Every run under way holds a
*finishing reserve*: what it is expected to still need, learned from the lane's
finished runs (:func:`lane_plugin.policy.reserve.fit_runs`).

Rules, in order (docs/admission.md, "The rules in full"):

1. nothing while the lane is stopped (operator stop or failed preflight); 1b. nothing while the
   provider paused it (a 429's ``retry-after``: ``now < paused_until``), the provider's word wins;
2. ``leased < max_leased``;
3. ``spent + reserved + est <= ceiling`` for every job (the hard ceiling), and
   ``+ headroom`` with ``headroom = ceil(headroom_sigmas * sqrt(var))``, ``var``
   the variance of ``actual - est`` summed over the leased jobs and this one
   (a learned estimator's spread, :meth:`lane_plugin.policy.LanePolicy.headroom`): estimates sit at the mean
   while what settles stays under the ceiling; and ``+ over``, the *drift
   allowance* (:mod:`lane_plugin.policy.drift`, learned with the profile from the
   lane's latest settlements): what is in flight and the job are charged at
   their drift-corrected size, and a quantile of the overruns seen is kept free
   per job in flight, the largest once. Where estimates cover the bill it is 0.
   It is a heuristic and never closes a lane: what it keeps free is capped at
   ``min(over, 5% of the ceiling, ceiling - est)`` (:func:`lane_plugin.policy.drift.capped`), so one
   outlier settlement costs a lane at most its last 5%, and a job whose estimate
   fits the empty lane fits it after a reset;
4. a starting or free job also leaves the reserve of every run under way (and a
   starting job its own run's expected rest): ``spent + reserved + finishing +
   est (+ rest) <= ceiling``; a finishing job may use the reserve: it is for it;
5. ``start_fraction`` (an option, default 1.0): a starting job also keeps
   ``spent + reserved + est <= start_fraction * ceiling`` (the article's flat stop);
6. sliding burst window: the rate tokens admitted in ``(now - window_seconds,
   now]`` plus ``rate_cost`` stay ``<= burst_tokens``. Checked at every
   admission, this bounds every span of ``window_seconds`` (the fullest span
   ends at an admission, which counted exactly that span); 6b. the same for each of the lane's other
   limits, over ``requests``, ``input_tokens`` and ``output_tokens`` (:mod:`lane_plugin.policy.limits`,
   with the statement and the proof), each window on its own;
7. order: one continuous priority, ascending ``prio = wait_since + est *
   age_factor`` with ``age_factor = max_wait_seconds / min(ceiling,
   burst_tokens)`` seconds per token; equivalently ``key = est + k * wait_since``
   with ``k = 1 / age_factor`` tokens per second: small jobs first, each second
   of waiting worth ``k`` tokens of size. Once the lane has learned a size-class
   boundary (:mod:`lane_plugin.policy.sizeclass`), two classes for the jobs that are not
   finishing at intake: ``wait_since`` at or under it, ``+ max_wait_seconds`` above;
8. backfilling: the first job in that order that does not fit (the *head*)
   keeps a shadow reservation (its tokens, rate tokens and a lease slot): later
   jobs get only room it does not need. A finishing job is not held back by a
   starting or free head's shadow (that head waits for runs under way to
   finish; holding back their stages would deadlock);
9. a job that cannot fit before the next reset (``spent`` alone leaves no room
   for it, or ``rate_cost > burst_tokens``, or its units exceed a limit's amount) holds no shadow: without a period
   it is parked (or moved to its fallback) with that reason at once; with a
   period it waits for the reset;
10. a job that can never fit is refused at intake (:func:`lane_plugin.policy.rules.never_fits`);
11. tenants (:mod:`lane_plugin.policy.fairness`): the candidates of several tenants are merged fairly by
    tokens in rule 7 (the Virtual Token Counter: the backlogged tenant with the least weighted service
    first, each tenant's own jobs in rule 7's order); a tenant with a budget keeps its ``spent`` plus its
    leased estimates plus ``est`` at or under its ceiling: a job it keeps out holds no shadow and blocks
    no other tenant, and without a tenant period, a job its ``spent`` alone leaves no room for is parked;
12. the overtaking budget (:mod:`lane_plugin.policy.overtake`; a lane's ``overtake_slack``, 1.25 by default): a job
    admitted while an older one waits is allowed only while what younger jobs took ahead of the oldest waiting job
    (``passed``), with it, stays at most every waiting job's key (``beta`` times the rate tokens it found
    waiting); a job it keeps out holds no shadow. So at most ``(1 + beta) V`` rate tokens are admitted
    ahead of a job that found ``V`` waiting: within ``1 + beta`` of token-fifo, by construction. Its quantile
    form (:mod:`lane_plugin.policy.slack`, the one the ledger runs) keys each job from a p99 of ``V`` as well, and adds
    a second allowance (``since``, ``dues``): the lane's p99 of tokens ahead within ``c`` of token-fifo's.

The order and the bound on how long a job that fits can wait: :mod:`lane_plugin.policy.order`; the
bound against token-fifo: :mod:`lane_plugin.policy.overtake`; the service-gap bound between tenants:
:mod:`lane_plugin.policy.fairness`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .candidate import FINISH, FREE, START, Candidate
from .drift import drift_cap
from .fairness import tenant_never_fits, tenant_room, tenant_unfit_reason
from .lane import LaneSnapshot
from .limits import blocking_limit
from .order import order
from .overtake import Overtaking
from .rules import BURST, LEASE_CAP, LIMIT_PREFIX, OVERTAKE, PAUSED, STOPPED, TENANT_CEILING, _rule, unfit_before_reset

# Admission reads the head of its indexes: the free lease slots plus this many rows.
HEAD_SLACK = 16


@dataclass(frozen=True)
class Decision:
    """What one tick admits, and why it stopped where it did.

    ``parked``: jobs that cannot fit before the next reset in a lane without a
    period, as ``(candidate, rule, reason)``; the caller parks them (or moves
    them to their fallback). ``runs``: the reserve and latest stage of every run
    an admitted job belongs to, after this tick, as ``(run_key, remaining, stage)``.
    ``burst_need``: the smallest window room (in rate tokens) a job blocked by
    the burst window needs, so a simulator can wake when the window has slid.
    ``var``: what the admitted jobs add to the lane's ``reserved_var``.
    ``limit_need``: for each limit (rule 6b) that blocked a job, the smallest room (in its unit) one needs.
    ``by_tenant``: the tokens admitted per tenant, as ``(tenant, tokens)`` (what their counters and
    budgets are charged). ``overtook``: the rate tokens admitted out of order (rule 12). ``exempt``: with rule 12's
    per-job rooms, the jobs still waiting that were passed while they could not go (held by their tenant's budget,
    waiting for the period to reset, or not leasable by this tick), with what passed them: not counted against them.
    ``uncharged``: the admitted stages of runs under way, which rule 12 neither held nor charges their passes to.

    Example:
        >>> from lane_plugin.policy import Candidate, LanePolicy, LaneSnapshot
        >>> s = LaneSnapshot(LanePolicy(ceiling=1_000), spent=900, reserved=0, leased=0, window_used=0, now=0.0)
        >>> d = admit(s, [Candidate("a", 50, 0.0), Candidate("b", 200, 0.0)])
        >>> d.ids, d.tokens, [(c.id, rule) for c, rule, _ in d.parked]   # no period: b can never fit, parked
        (['a'], 50, [('b', 'ceiling')])
    """

    admitted: tuple[Candidate, ...]
    tokens: int
    shadow: Candidate | None = None
    head_reason: str | None = None
    rate: int = 0
    finishing: int = 0
    runs: tuple[tuple[str, int, str | None], ...] = ()
    parked: tuple[tuple[Candidate, str, str], ...] = ()
    burst_need: int | None = None
    var: int = 0
    limit_need: tuple[tuple[str, int], ...] = ()
    units: tuple[tuple[str, int], ...] = ()
    # (derived from ``admitted``: not compared, so a decision equals one built without it)
    by_tenant: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    overtook: int = field(default=0, compare=False)
    # Rule 12's exact form: (job id, rate tokens) passed uncounted, the store gives back (perjob.exempt_charges).
    exempt: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    # Rule 12: the admitted stages of runs under way, which it neither holds nor charges (the store charges the rest).
    uncharged: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def ids(self) -> list[str]:
        """The ids of the admitted jobs, in admission order."""
        return [c.id for c in self.admitted]


def admit(snapshot: LaneSnapshot, candidates: Iterable[Candidate], *, ordered: bool = False) -> Decision:
    """Choose which candidates to lease now.

    Args:
        snapshot: the lane's counters and policy inside the admission transaction.
        candidates: the head of the waiting queue (any order; ids unique).
        ordered: the candidates already come in :func:`order`'s order; they are
            then read lazily and no further than needed (once the lease cap
            binds, only jobs to park and the head's reason are left to find).

    Returns:
        The admitted candidates in admission order and what they add to the
        lane's counters, the head holding a shadow reservation (if any), the
        rule that blocked the first job not admitted, and the jobs to park.

    Example:
        >>> from lane_plugin.policy import LanePolicy
        >>> p = LanePolicy(ceiling=1000, burst_tokens=500, max_leased=2)
        >>> s = LaneSnapshot(p, spent=0, reserved=0, leased=0, window_used=0, now=0.0)
        >>> admit(s, [Candidate("a", 300, 0.0), Candidate("b", 100, 0.0)]).ids
        ['b', 'a']
    """
    decision, held, refused = _admit(snapshot, candidates, ordered, snapshot.exempt)
    if refused and held - snapshot.exempt:
        # Rule 12's per-job rooms: a job found held late in the order (its tenant's budget has no room for it as the
        # tick found it, or it cannot fit before the period resets) bound the candidates before it. It cannot go this
        # tick whatever they do, so its room binds none of them: decide again with it exempt from the start. A job
        # held only by what this tick admitted before it is not: its room bound the passes made before its turn.
        decision, _, _ = _admit(snapshot, candidates, ordered, snapshot.exempt | held)
    return decision


def _admit(
    snapshot: LaneSnapshot, candidates: Iterable[Candidate], ordered: bool, exempt: frozenset[str]
) -> tuple[Decision, frozenset[str], bool]:
    """:func:`admit` with ``exempt`` rooms; also the candidates held this tick (per-job rooms only) and whether
    rule 12 refused any candidate."""
    p = snapshot.policy
    if snapshot.stopped:
        return Decision((), 0, head_reason=STOPPED), frozenset(), False
    if snapshot.paused_until is not None and snapshot.now < snapshot.paused_until:
        return Decision((), 0, head_reason=PAUSED), frozenset(), False
    candidates = list(candidates) if snapshot.rooms is not None else candidates  # (read twice if decided again)
    limits = snapshot.limits
    lim_used = {u.unit: 0 for u in limits}  # what this tick admits, per unit
    lim_need: dict[str, int] = {}
    sh_units: dict[str, int] = {}
    committed, finishing = snapshot.spent + snapshot.reserved, snapshot.finishing
    leased, window, var = snapshot.leased, snapshot.window_used, snapshot.reserved_var
    # Runs started and reserves changed in this tick, over the snapshot's (which may be large: not copied).
    started: set[str] = set()
    remaining: dict[str, int] = {}
    was_started, had = snapshot.started_runs, snapshot.run_remaining
    runs: dict[str, tuple[str, int, str | None]] = {}
    admitted: list[Candidate] = []
    parked: list[tuple[Candidate, str, str]] = []
    tokens = rate = 0
    shadow: Candidate | None = None
    sh_kind, sh_est, sh_extra, sh_rate, sh_slot, sh_var = FREE, 0, 0, 0, 0, 0
    head_reason: str | None = None
    burst_need: int | None = None

    left, burst, start_left = p.ceiling - snapshot.spent, p.burst_tokens, p.start_limit - snapshot.spent
    cap, resets = p.max_leased, snapshot.resets
    # The drift allowance (rule 3): in-flight estimates and the job's at their drift-corrected size, a spread per
    # job, one overrun. over_charge inlined (it runs per candidate): drift in 1/10,000 past 1, rounded up per total.
    drift, overrun, spread, spent = snapshot.drift, snapshot.overrun, snapshot.spread, snapshot.spent
    drifts = drift > 1.0 or overrun > 0 or spread > 0
    extra = max(0, round(drift * 10_000) - 10_000)
    # What it keeps free is capped (drift.capped): at most the last 5% of the ceiling, and never more than the
    # ceiling leaves the candidate (_rule caps the in-flight allowance the same way).
    ceiling, dcap = p.ceiling, drift_cap(p.ceiling)
    # Closed: no lease slot left, or the shadow overfills the window holding the smallest room (rates >= 0);
    # the rest can only be parked or give the head's reason, and with a period nothing is parked.
    closed = leased >= cap
    # Tenants with a budget (rule 11), and the tokens admitted per tenant in this tick.
    budgets = {name: t for name, t in snapshot.tenants.items() if t.ceiling is not None}
    by_tenant: dict[str, int] = {}
    budget_ok = Overtaking(
        snapshot.passed,
        snapshot.guard,
        snapshot.oldest,
        snapshot.since,
        snapshot.dues,
        snapshot.rooms,
        snapshot.guard_dues,
        exempt,
    )
    queue = candidates if ordered else order(snapshot, candidates)
    refused = False  # rule 12 refused a candidate
    uncharged: set[str] = set()  # stages of runs under way admitted: rule 12 neither held them nor charges them
    fixed: set[str] = set()  # candidates held whatever this tick admits (their tenant's budget as it stands, unfit)
    if budget_ok.on and budget_ok.spent():  # rule 12: no room to pass anybody, the oldest first in arrival order
        queue = budget_ok.oldest_first(queue)
    for c in queue:
        key, est, c_rate, c_var = c.run_key, c.est, c.rate, c.var
        if budgets and c.tenant in budgets:
            budget = budgets[c.tenant]
            if not tenant_room(budget, by_tenant.get(c.tenant, 0), est):  # no shadow: it blocks no other tenant
                why = tenant_never_fits(c.tenant, budget, est) or (
                    None if budget.resets else tenant_unfit_reason(c.tenant, budget, est)
                )
                if why is not None:
                    parked.append((c, TENANT_CEILING, why))
                budget_ok.left(c)  # rule 12 counts around it: held by its tenant, not by the order
                if not tenant_room(budget, 0, est):  # held whatever this tick admits: exempt in a second pass
                    fixed.add(c.id)
                head_reason = head_reason or TENANT_CEILING
                continue
        kind = FREE if key is None else FINISH if key in started or key in was_started else START
        need = est + (c.after if kind == START else 0)
        unfit = None
        own = p.headroom(c_var) if c_var else 0
        if drifts:
            own += min(overrun + spread - (-extra * est // 10_000), dcap, max(0, ceiling - est))
        units = c.units if limits else None
        too_big = units is not None and any(units[u.unit] > u.limit.amount for u in limits)
        if too_big or need + own > left or c_rate > burst or (kind == START and est > start_left):
            # Exactly unfit_before_reset's rules without their reasons: with a period and the head's
            # reason known, nothing is parked and no reason read, so the reason is not written.
            if resets and head_reason is not None:
                budget_ok.left(c)
                fixed.add(c.id)  # unfit by the snapshot alone: whatever this tick admits
                continue
            unfit = unfit_before_reset(p, c, kind, spent=spent, need=need, drift=drift, overrun=overrun, spread=spread)
        if unfit is not None:  # it holds no shadow and blocks nobody
            head_reason = head_reason or unfit[0]
            budget_ok.left(c)
            fixed.add(c.id)
            if not resets:
                parked.append((c, *unfit))
        elif closed:
            head_reason = head_reason or LEASE_CAP
        elif budget_ok.on and kind != FINISH and not budget_ok.allows(c):  # rule 12: no shadow, it passes nobody
            head_reason = head_reason or OVERTAKE
            refused = True
        else:
            held = shadow is not None and (sh_kind == FINISH or kind != FINISH)
            with_shadow = committed + (sh_est if held else 0)
            over = (
                overrun + spread * (leased + held + 1) - (-extra * (with_shadow - spent + est) // 10_000)
                if drifts
                else 0
            )
            rule = _rule(
                p,
                est,
                kind,
                with_shadow,
                leased + sh_slot,
                window + sh_rate,
                c_rate,
                finishing + (sh_extra if held else 0),
                need,
                var + c_var + (sh_var if held else 0),
                over,
            )
            if rule is None and units is not None:
                held_units = {k: lim_used[k] + (sh_units.get(k, 0) if shadow is not None else 0) for k in lim_used}
                blocked = blocking_limit(limits, units, held_units)
                if blocked is not None:
                    rule = LIMIT_PREFIX + blocked
                    room = units[blocked] + (sh_units.get(blocked, 0) if shadow is not None else 0)
                    lim_need[blocked] = min(lim_need.get(blocked, room), room)
            if rule is None:
                admitted.append(c)
                if kind == FINISH and budget_ok.on:  # runs under way finish first (rule 4): rule 12 does not count it
                    budget_ok.uncounted(c)
                    uncharged.add(c.id)
                else:
                    budget_ok.admitted(c)
                tokens += est
                rate += c_rate
                committed += est
                leased += 1
                window += c_rate
                var += c_var
                by_tenant[c.tenant] = by_tenant.get(c.tenant, 0) + est
                if units is not None:
                    for k in lim_used:
                        lim_used[k] += units[k]
                if key is not None:  # (kind != FREE)
                    finishing += c.after - (remaining[key] if key in remaining else had.get(key, 0))
                    remaining[key] = c.after
                    runs[key] = (key, c.after, c.stage)
                    started.add(key)
                closed = leased + sh_slot >= cap
            else:
                head_reason = head_reason or rule
                if rule == BURST:
                    room = c_rate + sh_rate
                    burst_need = room if burst_need is None else min(burst_need, room)
                if shadow is None and rule != LEASE_CAP:
                    shadow, sh_kind, sh_est, sh_rate, sh_slot, sh_var = c, kind, est, c_rate, 1, c_var
                    sh_extra = need - est if kind != FINISH else 0
                    sh_units = dict(units) if units is not None else {}
                closed = leased + sh_slot >= cap or (
                    shadow is not None and window + sh_rate > burst and burst_need is not None and burst_need <= sh_rate
                )
        if closed and head_reason is not None and resets:
            break  # nothing more can be leased, the reason is known, nothing is parked: the rest changes nothing
    exact = budget_ok.exact
    decision = Decision(
        tuple(admitted),
        tokens,
        shadow,
        head_reason,
        rate,
        finishing - snapshot.finishing,
        tuple(runs.values()),
        tuple(parked),
        burst_need,
        var - snapshot.reserved_var,
        tuple(sorted(lim_need.items())),
        tuple(lim_used.items()),
        tuple(by_tenant.items()),
        budget_ok.overtook,
        () if exact is None else tuple(exact.exempt_charges()),
        frozenset(uncharged),
    )
    held_ids = frozenset() if exact is None else frozenset(fixed) - {c.id for c, _, _ in parked}
    return decision, held_ids, refused
