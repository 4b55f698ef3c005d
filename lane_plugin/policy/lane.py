"""A lane as admission sees it: the numbers it obeys (:class:`LanePolicy`) and its state at one instant."""

from __future__ import annotations

import math
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any

from .defaults import LANE_DEFAULTS
from .fairness import TenantState
from .limits import NO_TOKENS_LIMIT, TOKENS, Limit, LimitUse
from .perjob import Rooms


@dataclass(frozen=True)
class LanePolicy:
    """The numbers admission obeys for one lane.

    ``limits``: the lane's sliding windows over ``requests``, ``input_tokens`` and ``output_tokens``
    (:mod:`lane_plugin.policy.limits`); the ``tokens`` window is ``burst_tokens`` / ``window_seconds``.

    Example:
        >>> p = LanePolicy(ceiling=10_000, burst_tokens=1_000, max_wait_seconds=600, start_fraction=0.8)
        >>> p.start_limit, p.age_factor
        (8000, 0.6)
    """

    ceiling: int
    start_fraction: float = LANE_DEFAULTS["start_fraction"]
    burst_tokens: int = LANE_DEFAULTS["burst_tokens"]
    window_seconds: float = LANE_DEFAULTS["window_seconds"]
    max_leased: int = LANE_DEFAULTS["max_leased"]
    max_wait_seconds: float = LANE_DEFAULTS["max_wait_seconds"]
    lease_seconds: float = LANE_DEFAULTS["lease_seconds"]
    headroom_sigmas: float = LANE_DEFAULTS["headroom_sigmas"]
    limits: tuple[tuple[str, Limit], ...] = ()

    @classmethod
    def of(cls, source: Any) -> LanePolicy:
        """The policy of anything carrying these fields by name (a lane row, simulator settings)."""
        return cls(
            **{f: getattr(source, f) for f in cls.__dataclass_fields__ if f != "limits"},
            limits=tuple(getattr(source, "limits", ())),
        )

    @property
    def all_limits(self) -> tuple[tuple[str, Limit], ...]:
        """Every limit of the lane, ``tokens`` (the burst window, unless dropped) first, then :attr:`limits`.

        Example:
            >>> LanePolicy(ceiling=10, burst_tokens=500, window_seconds=60.0).all_limits
            (('tokens', Limit(amount=500, window_seconds=60.0)),)
        """
        tokens = (
            () if self.burst_tokens >= NO_TOKENS_LIMIT else ((TOKENS, Limit(self.burst_tokens, self.window_seconds)),)
        )
        return tokens + tuple(self.limits)

    @property
    def start_limit(self) -> int:
        """Most tokens a lane may have committed when a job *starts* a run."""
        return int(self.ceiling * self.start_fraction)

    @property
    def age_factor(self) -> float:
        """Seconds of waiting one token of estimate is worth in the order (0: oldest first).

        See :func:`lane_plugin.policy.order.priority`.
        """
        return self.max_wait_seconds / min(self.ceiling, self.burst_tokens)

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
    (:func:`lane_plugin.policy.drift.fit_drift`; 1.0, 0 and 0: none); ``tenants`` the lane's
    tenants with jobs among the candidates (:class:`lane_plugin.policy.fairness.TenantState`: counters,
    weights, budgets; a tenant absent has weight 1 and no budget); ``limits`` the lane's windows
    over ``requests``, ``input_tokens`` and ``output_tokens`` with what each holds (rule 6b);
    ``paused_until`` when a provider's 429 closed the lane until (rule 1b: nothing before);
    ``passed``, ``guard`` and ``oldest`` the overtaking budget (rule 12, :mod:`lane_plugin.policy.overtake`):
    what younger jobs took ahead of the oldest waiting job, the least keys of the waiting jobs ``(key, id)``
    ascending, the ids of the oldest waiting jobs in arrival order (``guard`` empty: the rule is off);
    ``since`` and ``dues`` its second bound (:mod:`lane_plugin.policy.slack`, optional): the rate tokens that ever
    left the queue, and the least ``left at arrival + key`` of the waiting jobs ``(due, id)`` ascending (empty: none);
    ``guard_dues`` the due of each ``guard`` entry (rule 12's per-job reading of the two heads; empty: lane-wide);
    ``rooms`` rule 12's exact per-job form instead (:mod:`lane_plugin.policy.perjob`: the ledger's epochs, the
    simulator's tree; None: off), and ``exempt`` the waiting jobs whose rooms do not bind this tick (this tick
    cannot lease them: a gate's tick and a job nobody waits for).

    Example:
        >>> s = LaneSnapshot(LanePolicy(ceiling=1_000), spent=600, reserved=300, leased=2, window_used=0, now=0.0)
        >>> s.policy.ceiling - s.spent - s.reserved   # what admission may still lease
        100
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
    tenants: Mapping[str, TenantState] = field(default_factory=dict)
    limits: tuple[LimitUse, ...] = ()
    paused_until: float | None = None
    passed: int = 0
    guard: tuple[tuple[int, str], ...] = ()
    oldest: tuple[str, ...] = ()
    since: int = 0
    dues: tuple[tuple[int, str], ...] = ()
    rooms: Rooms | None = None
    guard_dues: tuple[int, ...] = ()
    exempt: frozenset[str] = frozenset()
