"""The public face of the token ledger: :class:`Ledger`.

Example:
    >>> from lane_plugin import Ledger
    >>> led = Ledger("sqlite:////tmp/doc-ledger.db")          # doctest: +SKIP
    >>> job = led.submit(stage="draft", est=1200)              # doctest: +SKIP
    >>> [lease] = led.tick("free")                             # doctest: +SKIP
    >>> led.settle(lease.job_id, actual=1310).overage          # doctest: +SKIP
    110
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..checks import SHADOW_VERSION_MAX, job_ref, number, tenant_name, text, tokens, when
from ..errors import InvalidInput, Replay
from ..policy.fairness import DEFAULT_TENANT, MAX_WEIGHT, MIN_WEIGHT
from . import admission, intake, limits, runs, settlement, status, tenants, upkeep, waiters
from .admitting import Admitting
from .audit import audit as audit_tables
from .bill import BillLine
from .db import Cursor, Database
from .jobs import Lease, Settled
from .lanes import LaneRow, clear_drift, delete_lane, read_lane, write_lane_settings
from .learning import LearningStore
from .limits_api import ProviderLimits, check_limits, split_rate_cost
from .preflight import PreflightCache
from .reads_api import LedgerReads
from .url import parse_url

Listener = Callable[[str, str, dict[str, Any]], None]
T = TypeVar("T")


class Ledger:
    """A token ledger in one database: lanes, jobs, leases and settlements.

    Args:
        url: ``sqlite:///PATH`` or ``postgresql+psycopg://...``; default
            ``LANE_DATABASE_URL`` or ``lane.db`` under ``PREFECT_HOME``.
        clock: a callable returning epoch seconds, for tests and simulations;
            default the database's clock (PostgreSQL) or the machine's (SQLite).
        listeners: callables ``(event, lane, payload)`` told after each commit
            (the Prefect gate turns them into Prefect events).
        retry_for: seconds a transaction is run again through failures that pass (SQLite busy, a
            PostgreSQL restart, a killed session, a serialization failure, a deadlock); anything else
            (a wrong database name, a refused login, a denied permission, a bad host name) raises
            :class:`~lane_plugin.errors.DatabaseError` at once, naming it.
        create: create the ledger on first use if there is none (default); with
            False a missing ledger raises :class:`~lane_plugin.errors.NoLedger`
            and nothing is created (read-only commands).
        send_slack: seconds by which a lease's request may reach the provider after
            its holder picked the lease up; the burst window counts each rate
            charge this ledger writes from then (default 0: from the pick-up; None:
            0.5 s, at most 5% of the lane's window). The Prefect gate's ledgers use
            ``LANE_SEND_SLACK_SECONDS`` (unset: None).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        clock: Callable[[], float] | None = None,
        listeners: list[Listener] | None = None,
        retry_for: float = 60.0,
        create: bool = True,
        send_slack: float | None = 0.0,
    ) -> None:
        self.url = parse_url(url)
        self.db = Database(self.url, retry_for=retry_for, create=create)
        self.clock = clock
        self.send_slack = None if send_slack is None else number("send_slack", send_slack, low=0.0, high=60.0)
        self.listeners: list[Listener] = list(listeners or [])
        self.preflight = PreflightCache()
        # Its parts, by responsibility: the methods of the sections named after their modules call them.
        self._admitting = Admitting(self)
        self.wakeups = self._admitting.wakeups
        self._reads = LedgerReads(self)
        self._learning = LearningStore(self)
        self._limits = ProviderLimits(self)

    def __repr__(self) -> str:
        return f"Ledger({str(self.url)!r})"

    def close(self) -> None:
        self.db.close()

    # -- plumbing ----------------------------------------------------------------
    def _now(self, cur: Cursor) -> float:
        return float(self.clock()) if self.clock is not None else cur.now()

    def _run(self, fn: Callable[[Cursor, float], T], *, write: bool = True, fault: str | None = None) -> T:
        return self.db.transaction(lambda cur: fn(cur, self._now(cur)), write=write, fault=fault)

    def _emit(self, event: str, lane: str, payload: dict[str, Any]) -> None:
        for listener in self.listeners:
            try:
                listener(event, lane, payload)
            except Exception:  # a broken listener must never undo a committed write
                pass

    def now(self) -> float:
        """The ledger's clock (the database's on PostgreSQL)."""
        return self._run(lambda cur, now: now, write=False)

    def upgrade(self) -> str | None:
        """Create or upgrade the schema (``lane db upgrade``); returns the revision."""
        self.db.ensure_schema()
        return self.db.revision()

    # -- intake ------------------------------------------------------------------
    def submit(
        self,
        stage: str,
        est: int,
        lane: str = "free",
        *,
        rate_cost: int | dict[str, int] | None = None,
        est_version: str | None = None,
        run_key: str | None = None,
        key: str | None = None,
        attempt: int = 1,
        deadline: float | None = None,
        wait_seconds: float | None = None,
        fallback: str | bool | None = None,
        shadows: dict[str, int] | None = None,
        est_input: int | None = None,
        rerun: bool = False,
        est_var: int = 0,
        waiter: str | None = None,
        tenant: str | None = None,
    ) -> str:
        """Record a job waiting for admission; returns its id.

        Args:
            stage: the pipeline stage (stored verbatim).
            est: estimated tokens, a whole number from 1 to 10**12: what the budget is charged
                until the job settles to its actual bill.
            lane: the lane to wait in.
            rate_cost: what the provider's rate limiter counts (e.g. prompt + max_tokens, as
                OpenAI counts TPM; default ``est``): the lane's sliding burst window counts it. A dict
                ``{"input": ..., "output": ...}`` splits it for the lane's ``input_tokens`` and
                ``output_tokens`` limits (its sum is the rate cost); otherwise ``est_input`` splits it.
            est_version: the estimator (name and version) that produced ``est``.
            run_key: the pipeline run this job belongs to (the Prefect flow run id).
            key: idempotency key; the same key again returns the same job.
            attempt: with ``key``, a higher attempt reopens the job (a retry); with ``rerun`` (the gate:
                the work runs again), so does this attempt again once it was leased, settled or failed.
            deadline: epoch seconds after which the job is parked if still waiting.
            wait_seconds: alternatively, the deadline relative to now.
            fallback: True for the lane's fallback, a lane name, or None.
            shadows: other estimators' numbers for this job, by version.
            est_input: the input (prompt) tokens counted, if known (learned estimators learn ``actual - est_input``).
            est_var: the variance of ``actual - est`` its estimator knows; admission keeps headroom for it.
            waiter: the waiting process (a gate: :func:`waiters.waiter_id`); its job leaves admission
                when it is gone. None (the CLI): the job is pulled by whoever ticks.
            tenant: who the job belongs to inside its lane (a deployment, a flow, a team): the lane is
                shared fairly by tokens between its tenants (:mod:`lane_plugin.policy.fairness`), each
                within its budget if it has one (``lane tenants set``). Default ``"default"``.

        Raises:
            InvalidInput: an argument is not valid (nothing is written).
            UnknownLane: the lane (or the fallback lane) does not exist.
            NeverFits: the job can never fit the lane, and no fallback lane takes it.
            ConflictingReplay: ``key`` names a job submitted with other values.
        """
        stage = text("stage", stage)
        lane = text("lane", lane)
        est = tokens("est", est)
        est_version = text("est_version", est_version, required=False)
        est_input = None if est_input is None else tokens("est_input", est_input, low=0)
        rate_cost, rate_input, rate_output = split_rate_cost(rate_cost, est, est_input)
        est_var = tokens("est_var", est_var, low=0)
        run_key = text("run_key", run_key, required=False)
        key = text("key", key, required=False)
        attempt = tokens("attempt", attempt)
        deadline = when("deadline", deadline)
        if wait_seconds is not None:  # a span: "expected epoch seconds" misled `lane submit --wait inf`
            wait_seconds = number("wait_seconds", wait_seconds, low=0.0, high=1e12)
        if fallback is not None and not isinstance(fallback, bool):
            fallback = text("fallback", fallback)
        shadows = {
            text("shadow version", v, limit=SHADOW_VERSION_MAX): tokens(f"shadow estimate {v!r}", e)
            for v, e in (shadows or {}).items()
        }
        job_id = uuid.uuid4().hex  # chosen before the transaction: a retried commit finds it

        waiter = text("waiter", waiter, limit=64, required=False)
        tenant = DEFAULT_TENANT if tenant is None else tenant_name(tenant)

        def record(cur: Cursor, now: float) -> tuple[str, str]:
            dl = now + wait_seconds if wait_seconds is not None else deadline
            out = intake.submit(
                cur,
                job_id=job_id,
                lane=lane,
                stage=stage,
                est=est,
                now=now,
                rate_cost=rate_cost,
                est_version=est_version,
                est_input=est_input,
                run_key=run_key,
                key=key,
                attempt=attempt,
                deadline=dl,
                fallback=fallback,
                shadows=shadows,
                rerun=bool(rerun),
                est_var=est_var,
                tenant=tenant,
                rate_input=rate_input,
                rate_output=rate_output,
            )
            if waiter is not None:
                waiters.claim(cur, out[0], waiter, now)
            return out

        jid, _ = self._run(record)
        return jid

    # -- admission: ticks, hand-offs, what a waiting gate asks (ledger/admitting.py) -------------------------
    def tick(self, lane: str = "free") -> list[Lease]:
        """Lease what fits in ``lane`` now (one short transaction); returns the leases.

        One ticker at a time per lane: a tick that finds another running returns ``[]`` at once
        (that one leases what fits; a settlement hands its room on itself).
        """
        return self._admitting.tick(lane)

    def try_tick(self, lane: str = "free", *, gated: bool = False, own: str | None = None) -> tuple[list[Lease], bool]:
        """:meth:`tick`, also telling whether it found another tick running (``busy``: nothing done).

        ``gated``: the caller runs no job but its waiters' (and ``own``): jobs nobody waits for are left
        to an explicit tick (:func:`lane_plugin.ledger.admission.tick`).
        """
        return self._admitting.try_tick(lane, gated=gated, own=own)

    def acquire(self, job_id: str) -> Lease | None:
        """Tick the job's lane and return the job's lease if it holds one now.

        The tick leases this job and the jobs a waiter waits for, never another job nobody waits for
        (this caller would drop its lease): another script's job is leased by that script's own poll.

        Raises :class:`JobParked` if the job was parked (or failed) while waiting.
        """
        return self._admitting.acquire(job_id)

    def take(self, row: tuple[Any, ...], *, sent: bool = False) -> Lease | None:
        """The lease a waiting job's own row shows (:data:`waiters.ROW_KEYS`), picked up now; None if it
        still waits. Raises :class:`JobParked` if it was parked (or failed) while waiting.

        ``sent``: the read that returned ``row`` stamped the rate charge already, a moment ago
        (:func:`waiters.rows_sent`, PostgreSQL's watcher): no transaction here, the body starts at once.
        """
        return self._admitting.take(row, sent=sent)

    def waiting_rows(self, job_ids: list[str]) -> list[tuple[Any, ...]]:
        """The waiting jobs' own rows (:data:`waiters.ROW_KEYS`): primary-key lookups, no lock, no tick."""
        return self._admitting.waiting_rows(job_ids)

    def heartbeat(self, waiter: str) -> None:
        """The waiting process ``waiter`` is still there."""
        self._admitting.heartbeat(waiter)

    def lease_expired(self) -> bool:
        """Has any lease expired unreaped, or does one end further ahead than a lane allows (a clock that went
        back: :mod:`~lane_plugin.ledger.leases`)? Index reads; either way a reap sets it right."""
        return self._admitting.lease_expired()

    def refit_runs(self, lane: str = "free") -> list[dict[str, Any]]:
        """Learn the lane's finishing reserve from its finished runs now (ticks do it every ``REFIT_SECONDS``).

        Returns the profile, one dict per stage: ``stage``, ``after_tokens`` (what a run needed after
        a job of that stage), ``hold_seconds`` (how long a quiet run keeps its reserve), ``runs``, ``fitted_at``.
        """
        lane = text("lane", lane)
        return self._run(lambda cur, now: (runs.refit(cur, lane, now, force=True), runs.profile(cur, lane))[1])

    def renew(self, job_id: str, token: str) -> float:
        """Extend a held lease by the lane's ``lease_seconds``; returns the new expiry."""
        job_id, token = text("job id", job_id), text("lease token", token)
        return self._run(lambda cur, now: admission.renew(cur, job_id, token, now=now))

    # -- settlement ----------------------------------------------------------------
    def settle(
        self,
        job: str | Lease,
        actual: int,
        *,
        attempt: int | None = None,
        outcome: str = "done",
        by_estimate: bool = False,
        unsent: bool = False,
        output: int | None = None,
    ) -> Settled:
        """Bill what an attempt really spent, exactly once.

        Args:
            job: a job id, ``ID:ATTEMPT``, or the :class:`Lease` being settled (its attempt is used).
            actual: tokens really spent by this attempt, 0 to 10**12 (more is refused,
                :class:`~lane_plugin.errors.InvalidInput` naming ``actual``, before anything is written).
            attempt: the attempt to settle; default the lease's (or the one ``ID:ATTEMPT`` names).
                With a bare id it is the job's only leased attempt; a job leased as several
                attempts refuses a bare id (:class:`~lane_plugin.errors.AmbiguousAttempt`).
            outcome: ``done`` or ``failed`` (the job's state afterwards, if the lease is live).
            by_estimate: ``actual`` is the estimate, billed because no usage was found
                (counted in the run's bill; never learned from).
            unsent: the attempt's request never went out: its lease was handed to the caller's waiter
                and never picked up (a gate whose wait ended just as it was leased). Its pending rate charge
                leaves the burst window instead of counting a full window from now. A lease already picked
                up is unaffected (its request may be out).
            output: the output tokens the call generated, as the provider's usage states them (the gate passes
                what its responses said): what the lane's ``output_tokens`` limit counts from now. Default:
                ``actual`` less the job's input, which reads prompt-cache tokens billed at a fraction as less
                output. 0 to 10**12 (else :class:`~lane_plugin.errors.InvalidInput` naming ``output``). A
                replay's is ignored: the first settlement's stands.

        A replay of the same (job, attempt) with the same ``actual`` returns the first result with
        ``replay=True`` and bills nothing; with another ``actual`` it is refused
        (:class:`~lane_plugin.errors.ConflictingReplay`). A settlement after the lease expired
        is still billed, marked ``late``: the provider billed those tokens. The room it frees is
        handed on in the same transaction: the gated jobs that now fit are leased.
        """
        if isinstance(job, Lease):
            attempt = job.attempt if attempt is None else attempt
            job = job.job_id
        job_id, attempt = job_ref("job id", job, None if attempt is None else tokens("attempt", attempt))
        actual = tokens("actual", actual, low=0)
        if output is not None:
            output = tokens("output", output, low=0)
        if outcome not in ("done", "failed"):
            raise InvalidInput("outcome", outcome, "expected done or failed")
        token = uuid.uuid4().hex

        def run(cur: Cursor, now: float) -> tuple[tuple[Settled, LaneRow], admission.Ticked | None]:
            done = settlement.settle(
                cur,
                job_id,
                actual=actual,
                attempt=attempt,
                outcome=outcome,
                now=now,
                by_estimate=bool(by_estimate),
                unsent=bool(unsent),
                output=output,
            )
            return done, self._admitting.hand_off(cur, now, done[0].lane, token, freed=not done[0].late, row=done[1])

        try:
            (result, after), handed = self._run(run, fault="settle")
        except Replay as replay:  # the first result, if this one repeats it (else ConflictingReplay)
            att = replay.details["attempt"]
            return settlement.replayed(
                self._run(lambda cur, now: settlement.first_settlement(cur, job_id, att), write=False), actual
            )
        if self.listeners:
            self._emit("lane.job.settled", result.lane, dict(vars(result)))
        self._admitting.handed(result.lane, handed)
        spent, ceiling = after.spent, after.ceiling
        if spent >= ceiling and spent - result.actual < ceiling:
            self._emit(
                "lane.lane.hard-stop", result.lane, {"spent": spent, "ceiling": ceiling, "overage": after.overage}
            )
        return result

    # -- upkeep --------------------------------------------------------------------
    def reap(self) -> upkeep.Moved:
        """Expired leases go back to the queue (attempt + 1) or, attempts exhausted, to the tail.

        A gated job's expired lease parks it and its waiter's other waiting jobs (``waiter gone``).
        The room freed is handed on in the same transaction.
        """
        token = uuid.uuid4().hex

        def run(cur: Cursor, now: float) -> tuple[upkeep.Moved, list[tuple[str, admission.Ticked | None]]]:
            moved = upkeep.reap(cur, now=now)
            return moved, [(lane, self._admitting.hand_off(cur, now, lane, token)) for lane in moved.freed]

        moved, handed = self._run(run)
        self._emit_parked(moved)
        for lane, h in handed:
            self._admitting.handed(lane, h)
        return moved

    def park_overdue(self) -> upkeep.Moved:
        """Reap, park jobs waiting past their deadline, and expire the tail."""
        moved = self.reap()
        parked = self._run(lambda cur, now: upkeep.park_overdue(cur, now=now))
        expired = self._run(lambda cur, now: upkeep.expire_tail(cur, now=now))
        self._emit_parked(parked)
        for job in expired.expired:
            self._emit("lane.job.expired", job["lane"], job)
        return upkeep.Moved(moved.requeued, moved.parked + parked.parked, expired.expired)

    def roll_periods(self) -> list[dict[str, Any]]:
        """Reset ``spent`` and ``overage`` of every lane whose period (daily/monthly) rolled over.

        Returns one dict per lane rolled (``lane, period, period_start, previous``)
        and emits ``lane.lane.period-reset`` for each.
        """
        rolled = self._run(lambda cur, now: upkeep.roll_periods(cur, now=now))
        for r in rolled:
            self._emit("lane.lane.period-reset", r["lane"], r)
        return rolled

    def _emit_parked(self, moved: upkeep.Moved) -> None:
        for job in moved.parked:
            self._emit("lane.job.parked", job["lane"], job)

    def park(self, job_id: str, reason: str = "parked by operator") -> bool:
        """Park a waiting job (it leaves the admission scan); False if it was not waiting."""
        job_id, reason = text("job id", job_id), text("reason", reason, limit=1000)
        tail = self._run(lambda cur, now: upkeep.park(cur, job_id, reason=reason, now=now))
        if tail:
            self._emit("lane.job.parked", tail["lane"], tail)
        return tail is not None

    def give_up_waiting(self, job_id: str, reason: str) -> str | None:
        """Deadline passed: move to the fallback lane if allowed (returns it), else park."""
        job_id = text("job id", job_id)
        lane = self._run(lambda cur, now: upkeep.move_to_fallback(cur, job_id, now=now))
        if lane is None:
            self.park(job_id, reason)
        return lane

    def requeue(self, job_id: str) -> None:
        """Return a parked job to the queue."""
        job_id = text("job id", job_id)
        self._run(lambda cur, now: upkeep.requeue(cur, job_id, now=now))

    def drop(self, job_id: str) -> None:
        """Fail a parked job for good."""
        job_id = text("job id", job_id)
        self._run(lambda cur, now: upkeep.drop(cur, job_id, now=now))

    # -- lanes ---------------------------------------------------------------------
    def lane(self, name: str) -> LaneRow:
        name = text("lane", name)
        return self._run(lambda cur, now: read_lane(cur, name), write=False)

    def set_lane(
        self,
        name: str,
        *,
        create: bool = True,
        force: bool = False,
        parked: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> LaneRow:
        """Change a lane's policy (``ceiling=...``); creates the lane if it is new, unless ``create=False``.

        A ceiling lowered under what the lane has already admitted this period is refused
        (:class:`~lane_plugin.errors.InvalidInput`, nothing written) unless ``force=True``.
        ``limits``: ``{unit: "500/60s" | Limit | None}`` or ``["requests=500/60s", ...]``, the lane's
        sliding-window limits to set or drop (:mod:`lane_plugin.policy.limits`; ``tokens`` is the burst window).
        Waiting jobs the new settings leave no way to fit go to their fallback, or are parked: ``parked``, a
        list, is extended with the tails of those parked (``lane lanes set`` says how many, and why).
        ``overtake_slack``: rule 12's slack (1 to 10; None or ``"off"``: off), which binds once the lane has learned
        its p99 backlog from a day of arrivals (:mod:`lane_plugin.ledger.overtake`); ``overtake_q``: that p99 in rate
        tokens, seeded so the rule binds at once (None: forget it and learn a day afresh).
        """
        name = text("lane", name, limit=64)
        lane_limits = check_limits(settings.pop("limits", None))

        def apply(cur: Cursor, now: float) -> tuple[LaneRow, list[dict[str, Any]]]:
            row = write_lane_settings(cur, now, name, settings, create, force=bool(force))
            # a lowered burst or ceiling (an allowance moves a default ceiling) can leave a waiting job no way
            # to fit: it leaves now, not never
            if lane_limits:
                row = limits.set_limits(cur, now, name, lane_limits)
            narrows = {"burst_tokens", "ceiling", "allowance"} & settings.keys() or lane_limits
            return row, upkeep.give_up_never_fitting(cur, row, now=now) if narrows else []

        row, tails = self._run(apply)
        for tail in tails:
            self._emit("lane.job.parked", tail["lane"], tail)
        if parked is not None:
            parked.extend(tails)
        return row

    def set_tenant(
        self,
        lane: str,
        tenant: str,
        *,
        weight: float | None = None,
        ceiling: int | None = None,
        no_ceiling: bool = False,
        period: str | None = None,
        create: bool = True,
        force: bool = False,
    ) -> dict[str, Any]:
        """Give a tenant of ``lane`` a weight (its share when backlogged) and/or a budget.

        Args:
            lane: the lane (it must exist).
            tenant: the tenant's name, as its jobs are submitted with.
            weight: its share relative to the lane's other tenants, from 1 to 1000 (default 1).
            ceiling: its budget inside the lane's: its spent plus its leased estimates never pass it.
            no_ceiling: remove its budget.
            period: when its spent resets: ``none``, ``daily`` or ``monthly`` (UTC).
            create: add the tenant if the lane has none of that name (False: ``UnknownTenant``, suggesting the
                closest).
            force: set a ceiling under what the tenant already admitted this period (refused otherwise: its
                jobs would wait until the next reset, and ``lane audit`` would report I1).

        Returns:
            The tenant as :meth:`tenants` lists it.
        """
        from .lanes import PERIODS

        lane = text("lane", lane)
        tenant = tenant_name(tenant)
        if weight is not None:
            weight = number("weight", weight, low=MIN_WEIGHT, high=MAX_WEIGHT)
        if ceiling is not None:
            ceiling = tokens("ceiling", ceiling)
        if period is not None and period not in PERIODS:
            raise InvalidInput("period", period, f"expected one of {', '.join(PERIODS)}")
        return self._run(
            lambda cur, now: tenants.set_tenant(
                cur,
                now,
                lane,
                tenant,
                create=create,
                weight=weight,
                ceiling=ceiling,
                no_ceiling=no_ceiling,
                period=period,
                force=bool(force),
            )
        )

    def tenants(self, lane: str | None = None) -> list[dict[str, Any]]:
        """The tenants of ``lane`` (or of every lane): ``weight``, ``ceiling``, ``period``, ``spent``,
        ``reserved``, ``waiting``, ``served`` (weighted service: tokens / weight), ``tokens_1h`` and
        ``share_1h`` (its share of the lane's tokens settled over the last hour)."""
        if lane is not None:
            lane = text("lane", lane)

            def check(cur: Cursor, now: float) -> list[dict[str, Any]]:
                read_lane(cur, lane)  # UnknownLane
                return tenants.listing(cur, now, lane)

            return self._run(check, write=False)
        return self._run(lambda cur, now: tenants.listing(cur, now, None), write=False)

    def delete_lane(self, name: str) -> None:
        """Delete a lane no job ever used (a typo); a used lane is stopped instead (``stopped=True``)."""
        name = text("lane", name, limit=64)
        self._run(lambda cur, now: delete_lane(cur, name))

    def clear_drift(self, name: str) -> LaneRow:
        """Forget the lane's learned drift allowance (drift 1.0, overrun 0, spread 0) in one transaction.

        For an allowance an outlier taught (a ``report_usage`` typo). Idempotent. The refit (every 5 minutes)
        relearns it only from settlements after the clear. Raises :class:`~lane_plugin.errors.UnknownLane`.
        """
        name = text("lane", name, limit=64)
        return self._run(lambda cur, now: clear_drift(cur, now, name))

    def report_lane_states(self, lane: str | None = None) -> list[dict[str, Any]]:
        """Lanes whose state (``ok``, ``finishing-only``, ``ceiling-spent``, ``preflight-failed``,
        ``stopped``) changed since last reported; each change is returned to one caller only.

        Example:
            >>> [c["state"] for c in led.report_lane_states()]          # doctest: +SKIP
            ['finishing-only']
        """
        lane = text("lane", lane, required=False)
        return self._run(lambda cur, now: status.report_states(cur, now, lane))

    def lanes(self) -> list[dict[str, Any]]:
        """Every lane with its counters, remaining room and waiting / parked counts, and why its work waits:
        ``head_job``, ``blocked_by`` and ``blocked_reason``, the first waiting job's :meth:`wait_status`."""
        return self._run(lambda cur, now: status.lane_status(cur, now), write=False)

    # -- reading: one job, where it waits, the tail, spend, history, your own query (ledger/reads_api.py) ----
    def job(self, job_id: str) -> dict[str, Any]:
        """One job as a dict (every column of the ``job`` table)."""
        return self._reads.job(job_id)

    def wait_status(self, job_id: str) -> dict[str, Any]:
        """Where a job stands while it waits: its place in the queue and the lane's room.

        ``position`` follows the admission order (priority: small first, age raising it): 1 means
        admission considers it first; 0 means the job is not waiting. ``blocked_by`` is the first
        rule the job fails right now (``ceiling``, ``drift``, ``headroom``, ``reserve``, ``start_limit``,
        ``burst``, ``lease_cap``, ``stopped``) or None if only jobs ahead of it are in the way; ``reason``
        says why, when it cannot fit before the next reset (it is parked, or waits for the period; the
        drift allowance does not reset, so a job it keeps out of the empty lane is told so).

        Example:
            >>> led.wait_status(job)["position"]                     # doctest: +SKIP
            3
        """
        return self._reads.wait_status(job_id)

    def tail(self, lane: str | None = None) -> list[dict[str, Any]]:
        """Parked jobs, oldest first, with their ``age`` in seconds."""
        return self._reads.tail(lane)

    def settled_jobs(self, *, lane: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        """Done jobs (finished within ``since`` seconds, if given) with what they cost.

        Keys: ``id, lane, stage, est, est_version, actual, overage, finished_at``;
        the drift report's input.
        """
        return self._reads.settled_jobs(lane=lane, since=since)

    def spend(self, *, lane: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        """Settlements in time order (``lane, settled_at, actual``), finished within ``since`` seconds."""
        return self._reads.spend(lane=lane, since=since)

    def shadow_estimates(self, *, lane: str | None = None) -> list[dict[str, Any]]:
        """Shadow estimates of done jobs: ``job_id, version, est`` (the article's ``est_v2``)."""
        return self._reads.shadow_estimates(lane=lane)

    def estimator_samples(self, version: str, *, lane: str | None = None) -> list[dict[str, Any]]:
        """Done jobs estimated by ``version`` (admission or shadow): ``stage, est, actual, finished_at``."""
        return self._reads.estimator_samples(version, lane=lane)

    def run_bill(self, run_key: str) -> list[BillLine]:
        """What one run (a Prefect flow run id) was estimated, billed and waited, per stage and lane.

        Example:
            >>> [(b.stage, b.jobs, b.drift) for b in led.run_bill(flow_run_id)]   # doctest: +SKIP
            [('critique', 24, 2.1), ('draft', 24, 1.0)]
        """
        return self._reads.run_bill(run_key)

    def history(self, days: float) -> list[dict[str, Any]]:
        """Done jobs submitted in the last ``days`` days, oldest first (``lane simulate --from-ledger``).

        Keys: ``created_at, stage, est, actual, run_key, rate_cost``.
        """
        return self._reads.history(days)

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a query of your own (``:name`` parameters) in a read-only transaction; returns ``(columns, rows)``.

        A statement that would write is refused (:class:`~lane_plugin.errors.InvalidInput`) and changes nothing;
        settings it makes (``set_config``, a pragma) or locks it takes end with it, never reaching the ledger's
        own later statements."""
        return self._reads.rows(sql, params)

    # -- checking -----------------------------------------------------------------
    def audit(self, *, grace: float = 60.0) -> list[str]:
        """Invariant violations I1-I7 found in the tables; empty when the ledger is sound."""
        grace = number("grace", grace, low=0.0, high=1e12)

        # write=False: one snapshot for every query on PostgreSQL too (no torn reads under load)
        return self.db.transaction(lambda cur: audit_tables(cur, self._now(cur), grace=grace), write=False)

    # -- learned estimators' samples and state (ledger/learning.py) ------------------------------------------
    def output_samples(
        self, *, window: int = 1000, lane: str | None = None, stage: str | None = None
    ) -> dict[str, list[tuple[int, int]]]:
        """Settled jobs to learn an output allowance from: ``{stage: [(est_input, actual), ...]}``.

        The newest ``window`` per stage, oldest first: done jobs that recorded
        their input tokens at intake and were billed real usage (never an
        estimate billed for missing usage).

        Example:
            >>> led.output_samples(window=200)["critique"][-1]                # doctest: +SKIP
            (412, 1130)
        """
        return self._learning.output_samples(window=window, lane=lane, stage=stage)

    def estimator_state(self, estimator: str | None = None) -> list[dict[str, Any]]:
        """A learned estimator's fitted state, one dict per stage (every estimator's by default).

        Keys: ``estimator, stage, revision, allowance, jobs, mean, m2, mean_input,
        p50, p90, p99, fitted_at``.
        """
        return self._learning.estimator_state(estimator)

    def save_estimator_state(self, estimator: str, rows: list[dict[str, Any]]) -> None:
        """Write a learned estimator's state for the given stages in one transaction.

        Every row is checked before anything is written; stages not in ``rows``
        keep their state.
        """
        self._learning.save_estimator_state(estimator, rows)

    # -- provider limits: a 429's pause, the provider's own count (ledger/limits_api.py) ---------------------
    def pause(self, lane: str, seconds: float, *, reason: str, job_id: str | None = None) -> float:
        """Close ``lane`` for ``seconds`` for every process (a provider's 429 said so); returns when it reopens.

        One transaction: ``lane.paused_until`` (a later pause in force is kept: the longest word wins), and
        the job's ``rate_limited`` count (the run bill's 429s). Admission leases nothing before it; each
        process that ticks the lane meanwhile wakes at that moment (:mod:`lane_plugin.ledger.wakeups`).
        Emits ``lane.paused``. A ``job_id`` the ledger does not have is UnknownJob, and nothing is paused.
        """
        return self._limits.pause(lane, seconds, reason=reason, job_id=job_id)

    def sent_now(self, job_id: str, attempt: int) -> None:
        """The attempt's request goes out now, not when its lease was picked up (it waited out a provider's
        pause in between): its charges count a full window from now (+ the send slack), later only."""
        self._limits.sent_now(job_id, attempt)

    def paused_for(self, lane: str) -> float:
        """Seconds until ``lane`` reopens after a provider's pause (0.0: it is open). A pause this process
        remembers that the ledger may not hold yet (:meth:`paused_unheard`) answers with no read; else one read,
        and the ledger's word wins: open there (its pause ended, or any process's probe reopened it) is open here,
        and paused there is the longer of its pause and the one this process heard from the provider."""
        return self._limits.paused_for(lane)

    def pause_state(self, lane: str) -> tuple[float, float | None, float | None]:
        """``lane``'s pause as the ledger holds it, one read: ``(left, ended, probe_left)``. ``left`` > 0: paused
        for that long. Else ``ended``: when the last pause ended if the lane has not reopened since (None: it is
        open), and ``probe_left``: how long the probe one gate claimed (:meth:`claim_probe`) still holds the lane
        (None: no probe out; 0 or less: its hold ran out)."""
        return self._limits.pause_state(lane)

    def claim_probe(self, lane: str, ended: float, hold: float) -> float | None:
        """Be the one request, of every process, that goes first after the pause that ended at ``ended`` (as
        :meth:`pause_state` read it): one conditional write. Returns when the claim's hold ends (the others
        send anyway after it: a probe that hangs must not stall the lane), or None: another gate has it, or
        the lane reopened or was paused again."""
        return self._limits.claim_probe(lane, ended, hold)

    def reopen(self, lane: str, ended: float) -> bool:
        """The probe after the pause that ended at ``ended`` went through, or its hold ran out: the lane is open
        for every process (a pause written since is kept: False then). Drops this process's memory of the pauses
        that ended (each in one dict operation)."""
        return self._limits.reopen(lane, ended)

    def give_back_probe(self, lane: str, ended: float, hold_until: float) -> None:
        """The claimed probe never sent (its gate was stopped first): the next gate claims it."""
        self._limits.give_back_probe(lane, ended, hold_until)

    def remember_pause(self, lane: str, seconds: float, *, written: bool = False) -> float:
        """Close ``lane`` for ``seconds`` in this process's memory (:meth:`pause` does it before its write, which
        may wait for the database's lock while other workers send); returns when it reopens.

        Until the ledger holds it (``written``, or :meth:`pause`'s write committed) the memory outranks the
        ledger (:meth:`paused_unheard`); after, the ledger's word wins (:meth:`paused_for`). Lock-free (a
        timeout may be raised into the thread at any bytecode): each pause is its own entry, set or dropped in
        one dict operation; ended ones are dropped at the next :meth:`remember_pause` or :meth:`reopen`.
        """
        return self._limits.remember_pause(lane, seconds, written=written)

    def paused_here(self, lane: str) -> float:
        """Seconds this process knows ``lane`` stays closed (:meth:`remember_pause`), with no database read."""
        return self._limits.paused_here(lane)

    def pauses_here(self, lane: str) -> frozenset[tuple[str, float]]:
        """The pauses of ``lane`` this process remembers now: what :meth:`paused_unheard` compares with after a
        read of the ledger, to tell a 429 heard here while the read was out."""
        return self._limits.pauses_here(lane)

    def paused_unheard(self, lane: str, known: frozenset[tuple[str, float]] | None = None) -> float:
        """Seconds this process knows ``lane`` stays closed that a read of the ledger may not show: a pause
        remembered whose write has not committed (or failed), or one not in ``known`` (:meth:`pauses_here`
        before the read). No database read."""
        return self._limits.paused_unheard(lane, known)

    def provider_used(
        self, lane: str, used: Mapping[str, int], *, job_id: str | None = None, refused: bool = False
    ) -> None:
        """The provider's own count of what its limits hold (``{unit: used}``, its limit less its
        ``x-ratelimit-remaining-*``), on the response to ``job_id``'s request (None: a count of now;
        ``refused``: its 429, which did not count it): each of
        the lane's windows holds the spend outside the lane it shows, and a margin for more
        (:func:`lane_plugin.ledger.limits.true_up_remaining`)."""
        self._limits.provider_used(lane, used, job_id=job_id, refused=refused)
