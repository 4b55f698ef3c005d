"""The ledger's tables, as SQLModel classes (the sliding windows' own in :mod:`.window_models`).

These classes are the schema's source of truth: the Alembic migrations shipped
in ``lane_plugin/ledger/migrations`` create exactly this (a test compares them on
SQLite and PostgreSQL), and users may query the ledger with them. The store
itself speaks plain SQL through the DB-API so that the CLI starts fast.

Times are Unix epoch seconds (floats), as in the article's ``lease_until real``;
on PostgreSQL they come from the database's clock. The ``job`` table keeps the
article's column names (``id, stage, est, actual, state, lease_until``) so its
drift query runs verbatim against a ledger.
"""

from __future__ import annotations

from typing import Optional

import sqlalchemy as sa
from sqlalchemy import BigInteger, CheckConstraint, Column, Index, Integer, UniqueConstraint, false, text
from sqlmodel import Field, SQLModel

from ..checks import SHADOW_VERSION_MAX
from ..policy import LANE_DEFAULTS as D

JOB_STATES = ("new", "leased", "done", "failed", "parked")
# The gated jobs still waiting (ix_job_gated's rows); admission.WAITERS_HEAD_SQL reads them
# with these very terms (SQLite uses a partial index only for a query whose WHERE repeats its terms).
GATED_WAITING = "state = 'new' and waiter is not null"
# The waiting jobs rule 12 numbered (lane_plugin.ledger.overtake): its two indexes hold only these.
NUMBERED_WAITING = "state = 'new' and arrival_pos is not null"
# Of those, the ones numbered already (not waiting for their lane's next tick, at -1): the oldest per tenant are read
# from these; a read by epoch asks only for the above, so it cannot be planned over them (migration 0021).
NUMBERED_POSITIONED = "state = 'new' and arrival_pos > 0"
# The waiting jobs a lane's next tick numbers (lane_plugin.ledger.overtake.PENDING).
TO_NUMBER = "state = 'new' and arrival_pos < 0"


def _big(**kw):
    return Field(sa_column_kwargs={}, sa_type=BigInteger, **kw)


class Lane(SQLModel, table=True):
    """A budget account: its policy and its counters."""

    __tablename__ = "lane"
    __table_args__ = (
        CheckConstraint("spent >= 0 and reserved >= 0 and overage >= 0 and leased >= 0", name="ck_lane_counters"),
        CheckConstraint("ceiling > 0 and burst_tokens > 0 and max_leased > 0", name="ck_lane_policy"),
        CheckConstraint("rate_basis in ('request', 'actual') and finishing >= 0", name="ck_lane_rate_reserve"),
        CheckConstraint("reserved_var >= 0 and headroom_sigmas >= 0", name="ck_lane_headroom"),
        CheckConstraint("drift >= 1 and drift_overrun >= 0 and drift_spread >= 0", name="ck_lane_drift"),
    )

    name: str = Field(primary_key=True, max_length=64)
    allowance: int = _big(default=D["allowance"])
    ceiling: int = _big(default=D["ceiling"])
    start_fraction: float = Field(default=D["start_fraction"])
    burst_tokens: int = _big(default=D["burst_tokens"])
    window_seconds: float = Field(default=D["window_seconds"])
    max_leased: int = Field(default=D["max_leased"])
    lease_seconds: float = Field(default=D["lease_seconds"])
    max_wait_seconds: float = Field(default=D["max_wait_seconds"])
    max_attempts: int = Field(default=D["max_attempts"])
    park_seconds: float = Field(default=D["park_seconds"])
    fallback: Optional[str] = Field(default=None, max_length=64)
    preflight: Optional[str] = Field(default=None)
    preflight_timeout: float = Field(default=D["preflight_timeout"])
    period: str = Field(default=D["period"], max_length=16)
    stopped: bool = Field(default=False)
    rate_basis: str = Field(default=D["rate_basis"], max_length=16, sa_column_kwargs={"server_default": "request"})
    # Standard deviations of the spread in flight kept free under the ceiling (policy.LanePolicy.headroom).
    headroom_sigmas: float = Field(default=D["headroom_sigmas"], sa_column_kwargs={"server_default": "2.0"})
    # counters
    spent: int = _big(default=0)
    reserved: int = _big(default=0)
    # The sum of est_var of the leased jobs: moved with reserved, by the same statements.
    reserved_var: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"})
    overage: int = _big(default=0)
    leased: int = Field(default=0)
    window_start: float = Field(default=0.0)  # rate charges at or before this were pruned from the window
    window_used: int = _big(default=0)  # the rate_cost of the rate_charge rows still in the window
    finishing: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"})
    profile_at: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})
    # The size-class boundary learned with the profile (policy.size_class_boundary; null: not yet).
    size_boundary: Optional[int] = Field(default=None, sa_type=BigInteger)
    # The drift allowance learned with the profile from the latest settlements (policy.fit_drift):
    # what is in flight is charged at est * drift, plus drift_spread per job and drift_overrun once.
    drift: float = Field(default=1.0, sa_column_kwargs={"server_default": "1.0"})
    drift_overrun: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"})
    drift_spread: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"})
    # Set by `lane lanes clear-drift` (the latest of its time and the lane's last settlement): the allowance
    # is learned only from settlements after it, so the settlement that taught an outlier is not relearned.
    drift_cleared_at: Optional[float] = Field(default=None)
    period_start: float = Field(default=0.0)
    preflight_ok: bool = Field(default=True)
    preflight_error: Optional[str] = Field(default=None)
    preflight_at: Optional[float] = Field(default=None)
    updated_at: float = Field(default=0.0)
    reported_state: Optional[str] = Field(default=None, max_length=32)
    # A provider's 429 closed the lane until then (admission leases nothing before), and why.
    paused_until: Optional[float] = Field(default=None)
    paused_reason: Optional[str] = Field(default=None)
    # After the pause ended: the one gate (of any process) sending the probe holds the lane until its answer
    # or until then; null: no probe out.
    probe_until: Optional[float] = Field(default=None)
    # Its limits over requests, input_tokens, output_tokens (policy.limits.spec_of); counters in lane_limit.
    limit_spec: Optional[str] = Field(default=None)
    # Rule 12 (lane_plugin.ledger.overtake): its slack (null: off), the p99 of the rate tokens waiting at
    # arrivals the refit learned (null: not yet), and the arrival counter that numbers the waiting jobs.
    overtake_slack: Optional[float] = Field(default=None)
    overtake_q: Optional[int] = Field(default=None, sa_type=BigInteger)
    # When the rule was turned on (null: off): it binds once it has learned Q from a day of arrivals since.
    overtake_since: Optional[float] = Field(default=None)
    arrivals: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"})


class Job(SQLModel, table=True):
    """One stage of one pipeline item."""

    __tablename__ = "job"
    __table_args__ = (
        # The admission scan reads only the head of this index: for each of the two classes
        # (jobs of runs under way, the rest) the waiting jobs in priority order.
        Index("ix_job_queue", "lane", "state", "finishing", "prio", "id"),  # id: one order for equal prio
        Index("ix_job_lease", "state", "lease_until"),
        Index("ix_job_deadline", "state", "deadline"),
        Index("ix_job_run", "lane", "run_key"),
        Index("ix_job_waiter", "waiter"),
        # The gated jobs still waiting, in ix_job_queue's order: does a settlement's hand-off have anyone to
        # lease to, and who is first (a tick leasing only waiters' jobs reads its head, not ix_job_queue's)?
        Index(
            "ix_job_gated",
            "lane",
            "finishing",
            "prio",
            "id",
            sqlite_where=text(GATED_WAITING),
            postgresql_where=text(GATED_WAITING),
        ),
        Index("ix_job_lane_created", "lane", "created_at"),  # the lane's latest estimates (size classes)
        # ix_job_queue and ix_job_gated per tenant: fair admission reads the head of each tenant's queue.
        Index("ix_job_tenant_queue", "lane", "tenant", "state", "finishing", "prio", "id"),
        Index(
            "ix_job_tenant_gated",
            "lane",
            "tenant",
            "finishing",
            "prio",
            "id",
            sqlite_where=text(GATED_WAITING),
            postgresql_where=text(GATED_WAITING),
        ),
        # Rule 12's rooms (lane_plugin.ledger.overtake): an epoch's least room is the head of the first; a
        # partial epoch is read, and its older jobs written, by a range of the second.
        Index(
            "ix_job_rooms",
            "lane",
            "tenant",
            "arrival_epoch",
            "overtake_base",
            sqlite_where=text(NUMBERED_WAITING),
            postgresql_where=text(NUMBERED_WAITING),
        ),
        Index(  # each tenant's oldest numbered waiting jobs (its rooms are its own)
            "ix_job_tenant_arrival",
            "lane",
            "tenant",
            "arrival_pos",
            sqlite_where=text(NUMBERED_POSITIONED),
            postgresql_where=text(NUMBERED_POSITIONED),
        ),
        Index(  # the jobs the lane's next tick numbers, in the order they entered
            "ix_job_pending",
            "lane",
            "wait_since",
            "id",
            sqlite_where=text(TO_NUMBER),
            postgresql_where=text(TO_NUMBER),
        ),
        CheckConstraint("est > 0 and actual >= 0 and attempt >= 1", name="ck_job_numbers"),
        CheckConstraint(f"state in {JOB_STATES!r}", name="ck_job_state"),
        CheckConstraint("rate_cost is null or rate_cost > 0", name="ck_job_rate_cost"),
        CheckConstraint("est_var >= 0", name="ck_job_est_var"),
    )

    id: str = Field(primary_key=True, max_length=64)
    lane: str = Field(max_length=64)
    stage: str
    est: int = _big()
    rate_cost: Optional[int] = _big(default=None)  # what the provider's rate limiter counts; null: est
    est_version: Optional[str] = Field(default=None)
    # The input (prompt) tokens counted at intake, when the estimator knew them: a learned
    # estimator learns output = actual - est_input from settled jobs.
    est_input: Optional[int] = Field(default=None, sa_type=BigInteger)
    # The variance of actual - est its estimator knew at intake (a learned stage's spread; 0: unknown).
    est_var: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"})
    actual: int = _big(default=0)
    state: str = Field(default="new", max_length=16)
    attempt: int = Field(default=1)
    lease_attempt: int = Field(default=0)
    lease_until: float = Field(default=0.0)
    lease_token: Optional[str] = Field(default=None, max_length=64)
    deadline: Optional[float] = Field(default=None)
    run_key: Optional[str] = Field(default=None)
    key: Optional[str] = Field(default=None, unique=True)
    fallback: Optional[str] = Field(default=None, max_length=64)
    reason: Optional[str] = Field(default=None)
    created_at: float = Field(default=0.0)
    wait_since: float = Field(default=0.0)
    # Place in the admission order (lane_plugin.policy.order.priority, by the lane's size_boundary when learned).
    prio: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})
    # Its run already has an admitted job in this lane (the job finishes a run under way).
    finishing: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    admitted_at: Optional[float] = Field(default=None)
    finished_at: Optional[float] = Field(default=None)
    # The process waiting for this gated job (waiter.id); null: submitted from the CLI, pulled by whoever ticks.
    waiter: Optional[str] = Field(default=None, max_length=64)
    # Who the job belongs to inside its lane (lane_plugin.policy.fairness): a deployment, a flow, a team.
    tenant: str = Field(default="default", max_length=64, sa_column_kwargs={"server_default": "default"})
    # The job's units for the input_tokens / output_tokens limits (null: unknown, its rate cost counts).
    rate_input: Optional[int] = Field(default=None, sa_type=BigInteger)
    rate_output: Optional[int] = Field(default=None, sa_type=BigInteger)
    # Provider rate-limit errors (429) its attempts met: the run bill counts them per stage.
    rate_limited: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # Rule 12, while it waits (null: not numbered; arrival_pos -1: to be numbered by the lane's next tick): its
    # arrival number and epoch, its key, its room's base
    # (room = base - its epoch's lane_epoch.passed) and the rate tokens it found waiting.
    arrival_pos: Optional[int] = Field(default=None, sa_type=BigInteger)
    arrival_epoch: Optional[int] = Field(default=None, sa_type=BigInteger)
    overtake_key: Optional[int] = Field(default=None, sa_type=BigInteger)
    overtake_base: Optional[int] = Field(default=None, sa_type=BigInteger)
    arrival_v: Optional[int] = Field(default=None, sa_type=BigInteger)


class Tenant(SQLModel, table=True):
    """One tenant of one lane: its share when backlogged, its optional budget, and its weighted service.

    ``served`` is the Virtual Token Counter (:mod:`lane_plugin.policy.fairness`): the tokens admitted
    for it divided by ``weight``, trued up to the actuals at settlement. ``spent`` is what its jobs
    settled in the current ``period`` (reset when it rolls); with a ``ceiling``, admission keeps its
    ``spent`` plus the estimates of its leased jobs at or under it. ``backlogged``: whether admission
    last saw jobs of it waiting (a tenant coming back from idle is lifted, never banks credit).
    """

    __tablename__ = "tenant"
    __table_args__ = (
        CheckConstraint("weight >= 1 and spent >= 0 and (ceiling is null or ceiling > 0)", name="ck_tenant_numbers"),
        CheckConstraint("period in ('none', 'daily', 'monthly')", name="ck_tenant_period"),
    )

    lane: str = Field(primary_key=True, max_length=64)
    name: str = Field(primary_key=True, max_length=64)
    weight: float = Field(default=1.0, sa_column_kwargs={"server_default": "1.0"})
    ceiling: Optional[int] = Field(default=None, sa_type=BigInteger)
    period: str = Field(default="none", max_length=16, sa_column_kwargs={"server_default": "none"})
    period_start: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})
    spent: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"})
    served: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})
    backlogged: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    updated_at: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})


class Waiter(SQLModel, table=True):
    """A process waiting for gated jobs: its heartbeat, and when it was found gone.

    A waiter is gone when it has not been seen for ``waiters.GONE_SECONDS`` (5 s) or a lease it held
    expired unrenewed: its jobs leave admission at once (parked, reason ``waiter gone``).
    """

    __tablename__ = "waiter"

    id: str = Field(primary_key=True, max_length=64)
    seen: float
    gone_at: Optional[float] = Field(default=None)


class Settlement(SQLModel, table=True):
    """What one attempt of one job really spent. The only way ``spent`` grows."""

    __tablename__ = "settlement"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", name="uq_settlement_job_attempt"),
        Index("ix_settlement_lane_at", "lane", "settled_at"),
        CheckConstraint("actual >= 0 and overage >= 0", name="ck_settlement_numbers"),
    )

    # BIGINT on PostgreSQL; INTEGER on SQLite, where only that is an alias of the rowid.
    id: Optional[int] = Field(
        default=None,
        sa_column=Column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    )
    job_id: str = Field(max_length=64)
    attempt: int
    lane: str = Field(max_length=64)
    est: int = _big()
    actual: int = _big()
    overage: int = _big(default=0)
    late: bool = Field(default=False)
    by_estimate: bool = Field(default=False, sa_column_kwargs={"server_default": sa.false()})
    outcome: str = Field(default="done", max_length=16)
    settled_at: float = Field(default=0.0)


class LaneMove(SQLModel, table=True):
    """A job that left a lane (for its fallback) after attempts of it were leased there.

    Attempts up to ``leased_upto`` that no earlier move of the job covers ran in ``lane``: a late
    settlement of one of them is billed there (its provider billed it), not in the lane the job is in
    now. Written by the move (one row per move of a job once leased), never at admission: every attempt
    leased since the job's last move was leased in its current lane.
    """

    __tablename__ = "lane_move"

    job_id: str = Field(primary_key=True, max_length=64)
    leased_upto: int = Field(primary_key=True)  # the job's last leased attempt when it left the lane
    lane: str = Field(max_length=64)
    moved_at: float = Field(default=0.0)


class Tail(SQLModel, table=True):
    """Parked jobs, kept out of the admission scan, each with a deadline."""

    __tablename__ = "tail"
    __table_args__ = (Index("ix_tail_lane_deadline", "lane", "deadline"),)

    job_id: str = Field(primary_key=True, max_length=64)
    lane: str = Field(max_length=64)
    stage: str
    est: int = _big()
    reason: str
    parked_at: float
    deadline: float


class ShadowEstimate(SQLModel, table=True):
    """A candidate estimator's number for a job (the article's ``est_v2``)."""

    __tablename__ = "shadow_estimate"

    job_id: str = Field(primary_key=True, max_length=64)
    version: str = Field(primary_key=True, max_length=SHADOW_VERSION_MAX)
    est: int = _big()


class LaneRun(SQLModel, table=True):
    """Runs that have an admitted job in a lane: their later stages are *finishing*.

    A run under way holds a finishing reserve (``remaining``: what it is expected
    to still need after its latest admitted ``stage``) until ``expires_at``; the
    lane row's ``finishing`` is the sum of the reserves. A lapsed run (no admission
    for its hold) has ``expires_at`` null and counts as finished for the profile.
    """

    __tablename__ = "lane_run"
    __table_args__ = (
        Index("ix_lane_run_expires", "lane", "expires_at"),
        Index("ix_lane_run_last", "lane", "last_at"),
    )

    lane: str = Field(primary_key=True, max_length=64)
    run_key: str = Field(primary_key=True)
    started_at: float = Field(default=0.0)
    stage: Optional[str] = Field(default=None)
    committed: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"})
    remaining: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"})
    last_at: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})
    expires_at: Optional[float] = Field(default=None)


class RunProfile(SQLModel, table=True):
    """What runs of a lane needed after each stage, learned from finished runs (policy.fit_runs)."""

    __tablename__ = "run_profile"

    lane: str = Field(primary_key=True, max_length=64)
    stage: str = Field(primary_key=True)
    after_tokens: int = _big(default=0)  # mean tokens the run took after a job of this stage
    hold_seconds: float = Field(default=0.0)  # twice the 95th percentile gap to the run's next admission
    runs: int = Field(default=0)
    fitted_at: float = Field(default=0.0)


class EstimatorState(SQLModel, table=True):
    """A learned estimator's fitted state per stage, shared by every process that estimates.

    ``allowance`` is what the estimator adds to a job's counted input tokens (the
    mean of ``actual - est_input`` when it was last published); ``revision`` is
    the digest of all of the estimator's published allowances, the ``#...`` part
    of its version. ``jobs``, ``mean``, ``m2`` (sum of squared deviations),
    ``p50``/``p90``/``p99`` describe the residuals of the newest settled jobs,
    refreshed at every refit, for admission headroom and reports.
    """

    __tablename__ = "estimator_state"

    estimator: str = Field(primary_key=True, max_length=64)
    stage: str = Field(primary_key=True)
    revision: str = Field(max_length=16)
    allowance: int = _big()
    jobs: int = Field(default=0)
    mean: float = Field(default=0.0)
    m2: float = Field(default=0.0)
    mean_input: float = Field(default=0.0)
    p50: float = Field(default=0.0)
    p90: float = Field(default=0.0)
    p99: float = Field(default=0.0)
    fitted_at: float = Field(default=0.0)


class LaneEpoch(SQLModel, table=True):
    """Rule 12's counter for one arrival epoch of one tenant of a lane: the rate tokens younger jobs of that tenant
    took ahead of its waiting jobs there."""

    __tablename__ = "lane_epoch"

    lane: str = Field(primary_key=True, max_length=64)
    tenant: str = Field(primary_key=True, max_length=64)
    epoch: int = Field(primary_key=True, sa_type=BigInteger)
    passed: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"})


# The sliding windows' tables live beside these (window_models): imported here so ``metadata`` holds them too.
from .window_models import LaneLimit, LimitCharge, RateCharge  # noqa: E402, F401

metadata = SQLModel.metadata
