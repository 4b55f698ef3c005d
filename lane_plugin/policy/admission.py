"""The admission policy: which waiting jobs a lane leases now.

Pure functions over plain values: no database, no Prefect, no clock. The store
feeds it a snapshot of one lane and the head of that lane's waiting queue and
applies the decision atomically; ``lane simulate`` feeds it a simulated clock.
Both run this very code, so what the simulator shows is what the ledger does.

Two currencies: a job charges the *budget* its estimate ``est`` (settled to the
bill) and the provider's *rate limiter* its ``rate_cost`` (what the provider
counts at request time, e.g. prompt + max_tokens; default ``est``). A
*finishing* job's run already has an admitted job in the lane, a *starting*
job's run has none, a *free* job has no run. Every run under way holds a
*finishing reserve*: what it is expected to still need, learned from the lane's
finished runs (:func:`fit_runs`).

Rules, in order (docs/architecture.md, "Admission"):

1. nothing while the lane is stopped (operator stop or failed preflight);
2. ``leased < max_leased``;
3. ``spent + reserved + est <= ceiling`` for every job (the hard ceiling), and
   ``+ headroom`` with ``headroom = ceil(headroom_sigmas * sqrt(var))``, ``var``
   the variance of ``actual - est`` summed over the leased jobs and this one
   (a learned estimator's spread, :func:`headroom`): estimates sit at the mean
   while what settles stays under the ceiling; and ``+ over``, the *drift
   allowance* (:mod:`lane_plugin.drift`, learned with the profile from the
   lane's latest settlements): what is in flight and the job are charged at
   their drift-corrected size, and a quantile of the overruns seen is kept free
   per job in flight, the largest once. Where estimates cover the bill it is 0.
   It is a heuristic and never closes a lane: what it keeps free is capped at
   ``min(over, 5% of the ceiling, ceiling - est)`` (:func:`capped`), so one
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
   ends at an admission, which counted exactly that span);
7. order: one continuous priority, ascending ``prio = wait_since + est *
   age_factor`` with ``age_factor = max_wait_seconds / min(ceiling,
   burst_tokens)`` seconds per token; equivalently ``key = est + k * wait_since``
   with ``k = 1 / age_factor`` tokens per second: small jobs first, each second
   of waiting worth ``k`` tokens of size. Once the lane has learned a size-class
   boundary (:func:`size_class_boundary`), two classes for the jobs that are not
   finishing at intake: ``wait_since`` at or under it, ``+ max_wait_seconds`` above;
8. backfilling: the first job in that order that does not fit (the *head*)
   keeps a shadow reservation (its tokens, rate tokens and a lease slot): later
   jobs get only room it does not need. A finishing job is not held back by a
   starting or free head's shadow (that head waits for runs under way to
   finish; holding back their stages would deadlock);
9. a job that cannot fit before the next reset (``spent`` alone leaves no room
   for it, or ``rate_cost > burst_tokens``) holds no shadow: without a period
   it is parked (or moved to its fallback) with that reason at once; with a
   period it waits for the reset;
10. a job that can never fit is refused at intake (:func:`never_fits`).

The wait bound. Let J wait since ``w`` with estimate ``e <= min(ceiling,
burst_tokens)``: ``prio <= w + max_wait_seconds`` either way, and a job arriving
at ``t`` has ``prio >= t``, so *no job arriving after J's prio* (after ``w + (e
- 1) * age_factor`` while the lane has no boundary) *is ever ahead of J*, whatever boundary
each job was placed by: that is within ``max_wait_seconds``. The jobs ahead of
J are a finite set, each admitted or parked in turn. Once J is the head past
that horizon, its shadow keeps what is admitted after it out of its room, so J
is admitted (or parked, if spend leaves it no room) within ``max(time for the
work leased before it to settle, window_seconds)``. The one exception is rule 8's: stages
of runs under way may pass a starting or free head; no new run starts past
it, so this is bounded by the runs under way when J became the head.
tests/policy check the bound on random traffic (hypothesis).
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field

# The drift allowance of the ceiling rule (rule 3), learned from recent settlements in .drift.
from .drift import DRIFT_CAP_FRACTION as DRIFT_CAP_FRACTION
from .drift import DRIFT_SAMPLE as DRIFT_SAMPLE
from .drift import capped as capped
from .drift import drift_cap as drift_cap
from .drift import fit_drift as fit_drift
from .drift import fit_drift_arrays as fit_drift_arrays
from .drift import over_charge as over_charge

# The finishing reserve (learned from finished runs) lives in .reserve; its names are read here too.
from .reserve import StageFit as StageFit
from .reserve import fit_runs as fit_runs
from .reserve import reserve_hold as reserve_hold
from .reserve import run_tokens as run_tokens

# The rules one job is checked against (rules 1-6, 9: blocking_rule, unfit_before_reset), their
# reasons and the kinds of job live in .rules; policy re-exports them.
from .rules import BURST as BURST
from .rules import CEILING as CEILING
from .rules import DRIFT as DRIFT
from .rules import FINISH as FINISH
from .rules import FREE as FREE
from .rules import HEADROOM as HEADROOM
from .rules import LEASE_CAP as LEASE_CAP
from .rules import RESERVE as RESERVE
from .rules import START as START
from .rules import START_LIMIT as START_LIMIT
from .rules import STOPPED as STOPPED
from .rules import _rule
from .rules import blocking_rule as blocking_rule
from .rules import unfit_before_reset as unfit_before_reset

# The size classes of the order (rule 7), learned from recent estimates in .sizeclass.
from .sizeclass import SIZE_CLASS_SAMPLE as SIZE_CLASS_SAMPLE
from .sizeclass import size_class_boundary as size_class_boundary

# Every lane setting's default, the one place they are written: the ledger's table
# (models.Lane), a lane created by `lane lanes set NEW`, and the simulator read them here.
# start_fraction 1.0: the finishing reserve keeps what runs under way need; nothing is left
# idle when nothing needs it. Set 0.8 for the article's flat stop at 80% of the ceiling.
LANE_DEFAULTS: dict = dict(
    allowance=10_000_000, ceiling=8_000_000, start_fraction=1.0, burst_tokens=40_000, window_seconds=1.0,
    max_leased=25, lease_seconds=90.0, max_wait_seconds=600.0, max_attempts=3, park_seconds=86_400.0,
    fallback=None, preflight=None, preflight_timeout=2.0, period="none", stopped=False, rate_basis="request",
    headroom_sigmas=2.0,
)  # fmt: skip
# Settings added after the first schema: migration 0001 writes DEFAULT_LANES without them and
# their own migration adds the column with the default above.
LATER_SETTINGS = ("rate_basis", "headroom_sigmas")
_FIRST = {k: v for k, v in LANE_DEFAULTS.items() if k not in LATER_SETTINGS}
# The two lanes of a new ledger: the free tier (the article's 10M with an 80% ceiling) and a paid one.
DEFAULT_LANES: dict[str, dict] = {
    "free": dict(_FIRST),
    "paid": dict(_FIRST, allowance=100_000_000, ceiling=100_000_000, burst_tokens=400_000, max_leased=100),
}  # fmt: skip
# What the provider's rate limiter counts: the rate_cost at request time, or the tokens really
# used (settlement then replaces the request's charge in the window with the actual).
RATE_BASES = ("request", "actual")
# Admission reads the head of its indexes: the free lease slots plus this many rows.
HEAD_SLACK = 16
# The finishing reserve is refit from finished runs at most this often, from the latest FIT_RUNS.
REFIT_SECONDS = 300.0
FIT_RUNS = 500



@dataclass(frozen=True)
class LanePolicy:
    """The numbers admission obeys for one lane."""

    ceiling: int
    start_fraction: float = LANE_DEFAULTS["start_fraction"]
    burst_tokens: int = LANE_DEFAULTS["burst_tokens"]
    window_seconds: float = LANE_DEFAULTS["window_seconds"]
    max_leased: int = LANE_DEFAULTS["max_leased"]
    max_wait_seconds: float = LANE_DEFAULTS["max_wait_seconds"]
    lease_seconds: float = LANE_DEFAULTS["lease_seconds"]
    headroom_sigmas: float = LANE_DEFAULTS["headroom_sigmas"]

    @classmethod
    def of(cls, source) -> LanePolicy:
        """The policy of anything carrying these fields by name (a lane row, simulator settings)."""
        return cls(**{f: getattr(source, f) for f in cls.__dataclass_fields__})

    @property
    def start_limit(self) -> int:
        """Most tokens a lane may have committed when a job *starts* a run."""
        return int(self.ceiling * self.start_fraction)

    @property
    def age_factor(self) -> float:
        """Seconds of waiting one token of estimate is worth in the order (0: oldest first)."""
        return self.max_wait_seconds / min(self.ceiling, self.burst_tokens)

    def priority(self, est: int, wait_since: float, size_class_boundary: int | None = None,
                 finishing: bool = False) -> float:
        """A waiting job's place in the order, lower first. ``size_class_boundary`` None, or a job
        ``finishing`` a run under way at intake (holding a run's later stage back strands what the run
        spent): one continuous priority, ``est * age_factor`` added; else two classes (rule 7).

        Example:
            >>> p = LanePolicy(ceiling=10_000, burst_tokens=1_000, max_wait_seconds=600)
            >>> p.priority(500, 100.0), p.priority(100, 300.0), p.priority(500, 100.0, 400, finishing=True)
            (400.0, 360.0, 400.0)
            >>> p.priority(500, 100.0, 400), p.priority(400, 300.0, 400)   # above / at the boundary
            (700.0, 300.0)
        """
        if size_class_boundary is None or finishing:
            return wait_since + est * self.age_factor
        return wait_since + (self.max_wait_seconds if est > size_class_boundary else 0.0)

    def headroom(self, var: int) -> int:
        """Tokens kept free for the spread of what is in flight: ``ceil(headroom_sigmas * sqrt(var))``.

        ``var`` is the summed variance of ``actual - est`` of the jobs in flight
        (independent errors add their variances). 0 where no estimator knows a spread.

        Example:
            >>> LanePolicy(ceiling=10_000, headroom_sigmas=2.0).headroom(25 * 100**2)   # 25 jobs, sd 100 each
            1000
        """
        return math.ceil(self.headroom_sigmas * math.sqrt(var)) if var > 0 and self.headroom_sigmas > 0 else 0


@dataclass(frozen=True)
class LaneSnapshot:
    """One lane at one instant, as read inside the admission transaction.

    ``window_used`` is the rate tokens admitted in ``(now - window_seconds, now]``;
    ``reserved_var`` the summed variance (``est_var``) of the leased jobs;
    ``started_runs`` the runs with an admitted job (only the candidates' are looked
    up); ``finishing`` the reserve of every run under way; ``run_remaining`` the
    reserve of the runs of the candidates (runs absent hold none); ``resets``
    whether the lane has a period (a job that does not fit now may after it);
    ``drift``, ``overrun`` and ``spread`` the lane's learned drift allowance
    (:func:`fit_drift`; 1.0, 0 and 0: none).
    """

    policy: LanePolicy
    spent: int
    reserved: int
    leased: int
    window_used: int
    now: float
    stopped: bool = False
    started_runs: Container[str] = field(default_factory=frozenset)
    finishing: int = 0
    run_remaining: Mapping[str, int] = field(default_factory=dict)
    resets: bool = False
    reserved_var: int = 0
    drift: float = 1.0
    overrun: int = 0
    spread: int = 0


@dataclass(frozen=True)
class Candidate:
    """A waiting job at the head of the queue.

    ``after`` is what its run is expected to still need once it is admitted
    (:func:`fit_runs`); ``prio`` its stored place in the order (computed by
    :meth:`LanePolicy.priority` when None); ``var`` the variance of its
    ``actual - est`` (``job.est_var``: its estimator's spread; 0 unknown).
    """

    id: str
    est: int
    waiting_since: float
    run_key: str | None = None
    rate_cost: int | None = None
    stage: str | None = None
    after: int = 0
    prio: float | None = None
    var: int = 0

    @property
    def rate(self) -> int:
        return self.est if self.rate_cost is None else self.rate_cost


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

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.admitted]


def kind_of(c: Candidate, started: frozenset[str] | set[str]) -> str:
    """:data:`FINISH`, :data:`START` or :data:`FREE` (see the module docstring)."""
    if c.run_key is None:
        return FREE
    return FINISH if c.run_key in started else START


def order(snapshot: LaneSnapshot, candidates: Iterable[Candidate]) -> list[Candidate]:
    """Admission order: ascending priority, ties by id."""
    p = snapshot.policy
    return sorted(candidates, key=lambda c: (p.priority(c.est, c.waiting_since) if c.prio is None else c.prio, c.id))


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
        >>> p = LanePolicy(ceiling=1000, burst_tokens=500, max_leased=2)
        >>> s = LaneSnapshot(p, spent=0, reserved=0, leased=0, window_used=0, now=0.0)
        >>> admit(s, [Candidate("a", 300, 0.0), Candidate("b", 100, 0.0)]).ids
        ['b', 'a']
    """
    p = snapshot.policy
    if snapshot.stopped:
        return Decision((), 0, head_reason=STOPPED)
    committed, finishing = snapshot.spent + snapshot.reserved, snapshot.finishing
    leased, window, var = snapshot.leased, snapshot.window_used, snapshot.reserved_var
    # Runs started and reserves changed in this tick, over the snapshot's (which may be large: not copied).
    started, remaining, was_started, had = set(), {}, snapshot.started_runs, snapshot.run_remaining
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
    for c in candidates if ordered else order(snapshot, candidates):
        key, est, c_rate, c_var = c.run_key, c.est, c.rate, c.var
        kind = FREE if key is None else FINISH if key in started or key in was_started else START
        need = est + (c.after if kind == START else 0)
        unfit = None
        own = p.headroom(c_var) if c_var else 0
        if drifts:
            own += min(overrun + spread - (-extra * est // 10_000), dcap, max(0, ceiling - est))
        if need + own > left or c_rate > burst or (kind == START and est > start_left):
            # Exactly unfit_before_reset's rules without their reasons: with a period and the head's
            # reason known, nothing is parked and no reason read, so the reason is not written.
            if resets and head_reason is not None:
                continue
            unfit = unfit_before_reset(p, c, kind, spent=spent, need=need, drift=drift, overrun=overrun, spread=spread)
        if unfit is not None:  # it holds no shadow and blocks nobody
            head_reason = head_reason or unfit[0]
            if not resets:
                parked.append((c, *unfit))
        elif closed:
            head_reason = head_reason or LEASE_CAP
        else:
            held = shadow is not None and (sh_kind == FINISH or kind != FINISH)
            with_shadow = committed + (sh_est if held else 0)
            over = overrun + spread * (leased + held + 1) - (-extra * (with_shadow - spent + est) // 10_000) if drifts else 0
            rule = _rule(p, est, kind, with_shadow, leased + sh_slot, window + sh_rate, c_rate,
                         finishing + (sh_extra if held else 0), need, var + c_var + (sh_var if held else 0), over)  # fmt: skip
            if rule is None:
                admitted.append(c)
                tokens, rate, committed, leased, window = tokens + est, rate + c_rate, committed + est, leased + 1, window + c_rate
                var += c_var
                if kind != FREE:
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
                closed = leased + sh_slot >= cap or (shadow is not None and window + sh_rate > burst
                                                     and burst_need is not None and burst_need <= sh_rate)  # fmt: skip
        if closed and head_reason is not None and resets:
            break  # nothing more can be leased, the reason is known, nothing is parked: the rest changes nothing
    return Decision(
        tuple(admitted), tokens, shadow, head_reason, rate, finishing - snapshot.finishing,
        tuple(runs.values()), tuple(parked), burst_need, var - snapshot.reserved_var,
    )  # fmt: skip


def window_expiry(at: float, window_seconds: float) -> float:
    """The first instant ``t`` at which a charge admitted at ``at`` has left the window (``at <= t - window_seconds``).

    ``at + window_seconds`` can round one step short, where the ledger would still count it.
    """
    t = at + window_seconds
    while t - window_seconds < at:
        t = math.nextafter(t, math.inf)
    return t


def never_fits(policy: LanePolicy, est: int, *, starts_run: bool = True, rate_cost: int | None = None,
               var: int = 0) -> str | None:
    """Why a job could never be admitted in this lane, or None.

    Checked at intake so that such a job is refused (or routed to a fallback
    lane) at once instead of waiting for ever.
    """
    rate_cost = est if rate_cost is None else rate_cost
    if rate_cost > policy.burst_tokens:
        what = "estimate" if rate_cost == est else "rate cost"
        return f"{what} {rate_cost} exceeds the lane's burst of {policy.burst_tokens} tokens per window"
    if est > policy.ceiling:
        return f"estimate {est} exceeds the lane's ceiling of {policy.ceiling}"
    if est + policy.headroom(var) > policy.ceiling:
        return (f"estimate {est} plus {policy.headroom(var)} tokens of headroom for its spread exceeds the lane's "
                f"ceiling of {policy.ceiling}")  # fmt: skip
    if starts_run and est > policy.start_limit:
        return (f"estimate {est} exceeds the lane's start limit of {policy.start_limit} "
                f"({policy.start_fraction:.0%} of the ceiling {policy.ceiling})")  # fmt: skip
    return None
