"""The admission policy: which waiting jobs a lane leases now.

Pure functions over plain values: no database, no Prefect, no clock. The store
feeds it a snapshot of one lane and the head of that lane's waiting queue and
applies the decision atomically; ``lane simulate`` feeds it a simulated clock.
Both run this very code, so what the simulator shows is what the ledger does.

Rules, in order (docs/architecture.md, "Admission"):

1. nothing while the lane is stopped (hard stop or failed preflight);
2. ``leased < max_leased``;
3. ``spent + reserved + est <= ceiling``, and for a job that *starts* a run also
   ``<= start_fraction * ceiling`` (the last fifth is for finishing);
4. tokens admitted in the current window ``+ est <= burst_tokens``;
5. order: *due* jobs (waited ``max_wait_seconds`` or more) first in age order,
   then smallest estimate first. The oldest due job that does not fit keeps a
   shadow reservation (its estimate and one lease slot), so smaller jobs may
   backfill only into room it does not need (EASY backfilling). The burst
   window is not shadowed: it refills next window, when the due job is first.
6. a job that can never fit is refused at intake (:func:`never_fits`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# Every lane setting's default, the one place they are written: the ledger's table
# (models.Lane), a lane created by `lane lanes set NEW`, and the simulator read them here.
LANE_DEFAULTS: dict = dict(
    allowance=10_000_000, ceiling=8_000_000, start_fraction=0.8, burst_tokens=40_000, window_seconds=1.0,
    max_leased=25, lease_seconds=90.0, max_wait_seconds=600.0, max_attempts=3, park_seconds=86_400.0,
    fallback=None, preflight=None, preflight_timeout=2.0, period="none", stopped=False,
)  # fmt: skip
# The two lanes of a new ledger: the free tier (the article's 10M with an 80% ceiling) and a paid one.
DEFAULT_LANES: dict[str, dict] = {
    "free": dict(LANE_DEFAULTS),
    "paid": dict(LANE_DEFAULTS, allowance=100_000_000, ceiling=100_000_000, start_fraction=1.0,
                 burst_tokens=400_000, max_leased=100),
}  # fmt: skip
# Admission reads the head of its indexes: the free lease slots plus this many rows.
HEAD_SLACK = 16

# Reasons a job is not admitted, in rule order. They are stable strings: the
# gate logs them, the CLI prints them and tests compare them.
STOPPED = "stopped"
LEASE_CAP = "lease_cap"
CEILING = "ceiling"
START_LIMIT = "start_limit"
BURST = "burst"


@dataclass(frozen=True)
class LanePolicy:
    """The numbers admission obeys for one lane."""

    ceiling: int
    start_fraction: float = LANE_DEFAULTS["start_fraction"]
    burst_tokens: int = LANE_DEFAULTS["burst_tokens"]
    window_seconds: float = LANE_DEFAULTS["window_seconds"]
    max_leased: int = LANE_DEFAULTS["max_leased"]
    max_wait_seconds: float = LANE_DEFAULTS["max_wait_seconds"]

    @classmethod
    def of(cls, source) -> LanePolicy:
        """The policy of anything carrying these fields by name (a lane row, simulator settings)."""
        return cls(**{f: getattr(source, f) for f in cls.__dataclass_fields__})

    @property
    def start_limit(self) -> int:
        """Most tokens a lane may have committed when a job *starts* a run."""
        return int(self.ceiling * self.start_fraction)


@dataclass(frozen=True)
class LaneSnapshot:
    """One lane at one instant, as read inside the admission transaction."""

    policy: LanePolicy
    spent: int
    reserved: int
    leased: int
    window_used: int
    now: float
    stopped: bool = False
    started_runs: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Candidate:
    """A waiting job at the head of the queue."""

    id: str
    est: int
    waiting_since: float
    run_key: str | None = None


@dataclass(frozen=True)
class Decision:
    """What one tick admits, and why it stopped where it did."""

    admitted: tuple[Candidate, ...]
    tokens: int
    blocked_due: Candidate | None = None
    head_reason: str | None = None

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.admitted]


def is_due(snapshot: LaneSnapshot, c: Candidate) -> bool:
    """A job that has waited ``max_wait_seconds`` or more goes before smaller ones."""
    return snapshot.now - c.waiting_since >= snapshot.policy.max_wait_seconds


def order(snapshot: LaneSnapshot, candidates: Iterable[Candidate]) -> list[Candidate]:
    """Due jobs oldest first, then the rest smallest first (ties: older, then id)."""
    due, rest = [], []
    for c in candidates:
        (due if is_due(snapshot, c) else rest).append(c)
    due.sort(key=lambda c: (c.waiting_since, c.id))
    rest.sort(key=lambda c: (c.est, c.waiting_since, c.id))
    return due + rest


def blocking_rule(
    policy: LanePolicy,
    *,
    est: int,
    starts_run: bool,
    committed: int,
    leased: int,
    window_used: int,
    stopped: bool = False,
) -> str | None:
    """The first rule that keeps a job of ``est`` tokens out, or None if it fits.

    ``committed`` is ``spent + reserved`` (plus any shadow reservation).
    """
    if stopped:
        return STOPPED
    if leased + 1 > policy.max_leased:
        return LEASE_CAP
    if committed + est > policy.ceiling:
        return CEILING
    if starts_run and committed + est > policy.start_limit:
        return START_LIMIT
    if window_used + est > policy.burst_tokens:
        return BURST
    return None


def admit(snapshot: LaneSnapshot, candidates: Iterable[Candidate]) -> Decision:
    """Choose which candidates to lease now.

    Args:
        snapshot: the lane's counters and policy inside the admission transaction.
        candidates: the head of the waiting queue (any order; ids unique).

    Returns:
        The admitted candidates in admission order, their total estimate, the
        oldest due job that could not be admitted (if any) and the rule that
        blocked the first job that was not admitted.

    Example:
        >>> p = LanePolicy(ceiling=1000, burst_tokens=500, max_leased=2)
        >>> s = LaneSnapshot(p, spent=0, reserved=0, leased=0, window_used=0, now=0.0)
        >>> admit(s, [Candidate("a", 300, 0.0), Candidate("b", 100, 0.0)]).ids
        ['b', 'a']
    """
    policy = snapshot.policy
    committed = snapshot.spent + snapshot.reserved
    leased = snapshot.leased
    window_used = snapshot.window_used
    started = set(snapshot.started_runs)
    shadow_tokens = 0
    shadow_slots = 0
    admitted: list[Candidate] = []
    tokens = 0
    blocked_due: Candidate | None = None
    head_reason: str | None = None

    for c in order(snapshot, candidates):
        starts_run = c.run_key is None or c.run_key not in started
        rule = blocking_rule(
            policy,
            est=c.est,
            starts_run=starts_run,
            committed=committed + shadow_tokens,
            leased=leased + shadow_slots,
            window_used=window_used,
            stopped=snapshot.stopped,
        )
        if rule is None:
            admitted.append(c)
            tokens += c.est
            committed += c.est
            leased += 1
            window_used += c.est
            if c.run_key is not None:
                started.add(c.run_key)
            continue
        if head_reason is None:
            head_reason = rule
        if blocked_due is None and is_due(snapshot, c):
            blocked_due = c
            shadow_tokens = c.est
            shadow_slots = 1
        if rule in (STOPPED, LEASE_CAP):
            break  # lease slots only fill up during a tick: nothing later fits
    return Decision(tuple(admitted), tokens, blocked_due, head_reason)


def never_fits(policy: LanePolicy, est: int, *, starts_run: bool = True) -> str | None:
    """Why a job of ``est`` tokens could never be admitted in this lane, or None.

    Checked at intake so that such a job is refused (or routed to a fallback
    lane) at once instead of waiting for ever.
    """
    if est > policy.burst_tokens:
        return f"estimate {est} exceeds the lane's burst of {policy.burst_tokens} tokens per window"
    if est > policy.ceiling:
        return f"estimate {est} exceeds the lane's ceiling of {policy.ceiling}"
    if starts_run and est > policy.start_limit:
        return (
            f"estimate {est} exceeds the lane's start limit of {policy.start_limit} "
            f"({policy.start_fraction:.0%} of the ceiling {policy.ceiling})"
        )
    return None


def window_start(now: float, window_seconds: float) -> float:
    """Start of the fixed burst window that contains ``now``."""
    if window_seconds <= 0:
        return now
    return (now // window_seconds) * window_seconds
