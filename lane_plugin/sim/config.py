"""What ``lane simulate`` simulates: one lane, one slow worker, one scenario.

Field names follow the ledger's lane (:class:`lane_plugin.policy.LanePolicy`
reads them by name); the rest describe the worker and the run.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policy import LANE_DEFAULTS as D
from ..policy import LanePolicy, never_fits
from ..policy.limits import EXTRA_UNITS, INPUT_TOKENS, OUTPUT_TOKENS, Limit
from .estimating import check_name
from .limits import job_units
from .traffic import Trace

PERIODS = {"none": None, "daily": 86_400.0, "monthly": 30 * 86_400.0}  # monthly: 30 days


@dataclass(frozen=True)
class SimConfig:
    """One lane, one worker, one scenario. Field names follow the ledger's lane.

    Worker: ``workers`` parallel slots; a job runs ``service_base`` seconds
    plus ``service_per_output_token`` per output token where the trace knows
    its output (LLM latency follows the tokens generated), else
    ``service_per_token`` per actual token (generated traffic, est/actual
    traces). ``chain``: stage k+1 of a run is submitted when stage k settles
    (instead of at its recorded arrival time). ``horizon`` None runs until
    the queue is drained (or nothing can ever be admitted again).

    Example:
        >>> SimConfig(ceiling=1_000).lane_policy.ceiling
        1000
    """

    ceiling: int = D["ceiling"]
    allowance: int = D["allowance"]
    start_fraction: float = D["start_fraction"]
    burst_tokens: int = D["burst_tokens"]
    window_seconds: float = D["window_seconds"]
    max_leased: int = D["max_leased"]
    lease_seconds: float = D["lease_seconds"]
    max_wait_seconds: float = D["max_wait_seconds"]
    max_attempts: int = D["max_attempts"]
    rate_basis: str = D["rate_basis"]
    headroom_sigmas: float = D["headroom_sigmas"]
    period_seconds: float | None = None
    workers: int = 1
    service_base: float = 1.0
    service_per_token: float = 0.001
    service_per_output_token: float = 0.02
    sleep_seconds: float = 0.0
    sleep_every: float = 0.0
    preflight: bool = False
    deadline: float | None = None
    count_slots: int | None = None
    horizon: float | None = None
    starve_after: float = 3_600.0
    chain: bool = True
    estimator: str | None = None
    warmup: int = 200
    tenant_weights: tuple[tuple[str, float], ...] = ()  # (tenant, weight); a tenant not named has weight 1
    # The overtaking budget (rule 12, lane_plugin.policy.overtake) of the ``lane`` policy: at most (1 + beta) x the
    # rate tokens a job found waiting are admitted ahead of it (lane_plugin.policy.overtake.OVERTAKE_BETA: 0.25).
    # None: off (an exploration; the ledger runs the quantile form below).
    overtake_beta: float | None = None
    # Rule 12's quantile form (lane_plugin.policy.slack), the ledger's: keys max((c - 1) V, c Q - V), Q the lane's
    # p99 of V, so the lane's p99 of tokens ahead stays within c x token-fifo's. On by default, as in the ledger
    # (LANE_DEFAULTS["overtake_slack"], 1.25); None: off (the order alone).
    overtake_slack: float | None = D["overtake_slack"]
    # Which of the lane's days with the rule on the run is, when Q is not given (overtake_learned None):
    # 2 (the default) its second day on, as the ledger runs from then: Q learned from a first replay of the same
    # traffic run as the learning day (the lane saw the same traffic yesterday: an optimistic prior);
    # 1 its learning day: keys unbounded, the order alone (the ledger's first day);
    # 0 the running estimate (an exploration, not the ledger's: keys from the running p99 of V so far).
    overtake_day: int = 2
    # The p99 of V (rate tokens) the lane learned before this run (as the ledger's refit learns it from the last
    # day's arrivals, or ``lane lanes set --overtake-q`` seeds it): every key reads it. None: per overtake_day.
    overtake_learned: int | None = None
    # How each waiting job is charged what passed it: its own count against its own key (True, the ledger's form,
    # lane_plugin.policy.perjob), or the two lane-wide index heads (False, an exploration). With the rule off: unused.
    overtake_exact: bool = True
    # With overtake_exact: the same rooms kept per arrival epoch of this many positions, one counter each, as the
    # ledger keeps them (lane_plugin.sim.rooms.EpochRooms), instead of in a segment tree (None). Same figures.
    overtake_epoch: int | None = None
    # With overtake_slack: each waiting job within either of its two allowances (key against passed, due against
    # left), read down the key index with each row's due, instead of one of the two lane-wide heads for all.
    overtake_either: bool = False
    # The lane's limits other than tokens (requests, input_tokens, output_tokens): LanePolicy.limits.
    limits: tuple[tuple[str, Limit], ...] = ()

    def __post_init__(self) -> None:
        positive = ("ceiling", "allowance", "burst_tokens", "max_leased", "max_attempts", "workers", "lease_seconds")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")
        if not 0 < self.start_fraction <= 1:
            raise ValueError(f"start_fraction={self.start_fraction!r} must be in (0, 1]")
        for name in (
            "window_seconds",
            "max_wait_seconds",
            "service_base",
            "service_per_token",
            "service_per_output_token",
            "sleep_seconds",
            "sleep_every",
            "starve_after",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 0")
        if not self.headroom_sigmas >= 0:
            raise ValueError(f"headroom_sigmas={self.headroom_sigmas!r} must be >= 0")
        if not self.warmup >= 0:
            raise ValueError(f"warmup={self.warmup!r} must be >= 0")
        if self.overtake_beta is not None and not 0 <= self.overtake_beta < float("inf"):
            raise ValueError(f"overtake_beta={self.overtake_beta!r} must be >= 0 and finite (or None: off)")
        if self.overtake_slack is not None and not 1 <= self.overtake_slack < float("inf"):
            raise ValueError(f"overtake_slack={self.overtake_slack!r} must be >= 1 and finite (or None: off)")
        if self.overtake_learned is not None and not self.overtake_learned >= 0:
            raise ValueError(f"overtake_learned={self.overtake_learned!r} must be >= 0")
        if self.overtake_learned is not None and self.overtake_slack is None:
            raise ValueError(
                f"overtake_learned={self.overtake_learned!r} needs overtake_slack set (it is that rule's p99)"
            )
        if self.overtake_day not in (0, 1, 2):
            raise ValueError(f"overtake_day={self.overtake_day!r} must be 0 (running estimate), 1 or 2")
        if self.overtake_epoch is not None:
            epoch = self.overtake_epoch
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
                raise ValueError(f"overtake_epoch={epoch!r} must be a whole number >= 1 (positions per epoch)")
            if not self.overtake_exact:
                raise ValueError(f"overtake_epoch={epoch!r} needs overtake_exact=True (it keeps that form's rooms)")
        if self.overtake_either and self.overtake_slack is None:
            raise ValueError("overtake_either=True needs overtake_slack (the dues are the slack's second bound)")
        if self.overtake_slack is not None and self.overtake_beta is not None:
            raise ValueError(
                f"overtake_beta={self.overtake_beta!r} and overtake_slack={self.overtake_slack!r}: "
                "set one, the other None (the slack's keys carry their own pointwise part, slack - 1)"
            )
        check_name(self.estimator)
        if self.rate_basis not in ("request", "actual"):
            raise ValueError(f"rate_basis={self.rate_basis!r} must be 'request' or 'actual'")
        if self.sleep_seconds and not self.sleep_every > self.sleep_seconds:
            raise ValueError(f"sleep_every={self.sleep_every!r} must be > sleep_seconds={self.sleep_seconds!r}")
        units = [unit for unit, _ in self.limits]
        for unit, lim in self.limits:
            if unit not in EXTRA_UNITS:
                raise ValueError(
                    f"limits: unit={unit!r} must be one of {', '.join(EXTRA_UNITS)} "
                    "(tokens is burst_tokens / window_seconds)"
                )
            if units.count(unit) > 1:
                raise ValueError(f"limits: unit={unit!r} is given twice")
            if not (lim.amount > 0 and lim.window_seconds > 0):
                raise ValueError(f"limits: {unit}={lim.amount}/{lim.window_seconds}s must be > 0 per > 0 seconds")
        for name in ("period_seconds", "deadline", "count_slots", "horizon"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name}={value!r} must be > 0 (or unset)")

    @property
    def lane_policy(self) -> LanePolicy:
        """The :class:`LanePolicy` the ledger would build from these fields."""
        return LanePolicy.of(self)

    @property
    def slots(self) -> int:
        """Lease slots of the count baseline (defaults to ``max_leased``)."""
        return self.count_slots or self.max_leased


def refused_at_intake(trace: Trace, cfg: SimConfig) -> list[bool]:
    """Jobs refused at intake because they could never be admitted, for every policy alike.

    The ledger's own check (:func:`lane_plugin.policy.never_fits`), which also
    refuses a ``rate_cost`` above ``burst_tokens``: no window could ever admit
    such a request (the provider would refuse it too), so no policy waits on it.
    """
    pol = cfg.lane_policy
    seen: set[str] = set()
    out = []
    inputs = trace.input_tokens
    for j, (e, rc, rk) in enumerate(zip(trace.est, trace.rate_costs(), trace.run_key)):  # a run's first job starts it
        units = job_units(rc, e, inputs[j]) if pol.limits else None
        starts = rk is not None and rk not in seen
        out.append(
            never_fits(
                pol,
                e,
                starts_run=starts,
                rate_cost=rc,
                input_cost=units and units[INPUT_TOKENS],
                output_cost=units and units[OUTPUT_TOKENS],
            )
            is not None
        )
        if rk is not None:
            seen.add(rk)
    return out


__all__ = ["PERIODS", "SimConfig", "refused_at_intake"]
