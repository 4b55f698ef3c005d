"""Every SQL statement the ledger runs, by name: the one module that holds SQL text (issue 26).

The ledger's modules run these through their transaction's :class:`~lane_plugin.ledger.cursor.Cursor`
(``cur.one(queries.JOBS_FIND_JOB, {"id": job_id})``) and never write SQL themselves; the layout test
(``tests/layout``) fails on SQL text anywhere else in the package (the alembic migrations under
``ledger/migrations`` are history, and exempt).

A statement is a constant, built once at import (column lists included), or, where a piece of it varies
by call (a list of ``:j0, :j1...`` parameters, a lane's priority expression, an optional condition), a
small builder function of plain values: flags, parameter names, expressions this module built. Sections
follow the module that runs them; a name starts with that module's (``LEASES_BOUND`` in leases.py). Both
databases take ``:name`` parameters (the cursor turns them into psycopg's); the dialects' differences
(``for update``, ``begin immediate``, ``insert or ignore``) are named variants here.
"""

from __future__ import annotations

from collections.abc import Iterable


def _marks(keys: Iterable[str]) -> str:
    """``:a, :b``: the parameters ``keys``, as a list of values."""
    return ", ".join(":" + k for k in keys)


def _assign(cols: Iterable[str]) -> str:
    """``a = :a, b = :b``: each column set from the parameter of its name."""
    return ", ".join(f"{k} = :{k}" for k in cols)


# -- leases ----------------------------------------------------------------------------------------------
LEASES_BOUND = (
    "update job set lease_until = :until where lane = :l and state = 'leased' and lease_until > :far returning id"
)
LEASES_OUT_OF_BOUNDS_SELECT_LANE = "select max(lease_seconds) from lane"
LEASES_OUT_OF_BOUNDS_SELECT_JOB = "select 1 from job where state = 'leased' and lease_until > :far limit 1"


def leases_too_far_ahead(limit: int) -> str:
    """The leases ending too far ahead (:now, :skew), furthest first, at most ``limit``."""
    return (
        "select j.id, j.lane, j.lease_until, l.lease_seconds from job j join lane l on l.name = j.lane "
        "where j.state = 'leased' and j.lease_until > :now + l.lease_seconds + :skew order by j.lease_until desc "
        f"limit {int(limit)}"
    )


# -- jobs ------------------------------------------------------------------------------------------------
ALL_JOB_COLUMNS = tuple(
    "id lane stage est rate_cost est_version est_input est_var actual state attempt lease_attempt "
    "lease_until lease_token deadline run_key key fallback reason created_at wait_since prio finishing "
    "admitted_at finished_at waiter tenant rate_input rate_output rate_limited".split()
)
JOB_COLS = (
    "id, lane, stage, est, attempt, run_key, state, lease_until, "
    "lease_token, lease_attempt, fallback, key, est_var, tenant"
)
JOBS_FIND_JOB = f"select {JOB_COLS} from job where id = :id"
JOBS_FIND_JOB_FOR_UPDATE = JOBS_FIND_JOB + " for update"  # PostgreSQL: the job's row too, after its lane's
JOBS_RUN_STARTED = "select 1 from lane_run where lane = :l and run_key = :r"

JOBS_LEFT_LANE = (
    "insert into lane_move (job_id, leased_upto, lane, moved_at) values (:j, :u, :l, :now) on conflict do nothing"
)
JOBS_RAN_IN = "select lane from lane_move where job_id = :j and leased_upto >= :a order by leased_upto limit 1"


# -- cursor ----------------------------------------------------------------------------------------------
CLOCK_NOW = "select extract(epoch from clock_timestamp())"  # PostgreSQL: the server's clock


# -- bill ------------------------------------------------------------------------------------------------
BILL_LANE_NAMES = "select name from lane order by name"


def bill_jobs_of_run(keys: Iterable[str]) -> str:
    """The jobs of run ``:r`` in the lanes named by the parameters ``keys``, with their settlements."""
    marks = _marks(keys)
    return (
        "select j.id, j.stage, j.lane, j.est, j.created_at, j.admitted_at, j.tenant, j.rate_limited, "
        "s.lane, s.actual, s.overage, s.by_estimate, s.late from job j left join settlement s on s.job_id = j.id "
        f"where j.lane in ({marks}) and j.run_key = :r"
    )


# -- learning --------------------------------------------------------------------------------------------
def learning_output_samples(lane: bool, stage: bool) -> str:
    """The newest ``:w`` learnable jobs per stage; of lane ``:lane`` and stage ``:stage`` when asked."""
    where = ["j.state = 'done'", "j.est_input is not null"]
    if lane:
        where.append("j.lane = :lane")
    if stage:
        where.append("j.stage = :stage")
    return (
        "select stage, est_input, actual from (select j.id, j.stage, j.est_input, j.actual, j.finished_at, "
        "row_number() over (partition by j.stage order by j.finished_at desc, j.id desc) as rn from job j "
        f"where {' and '.join(where)} and not exists (select 1 from settlement s where s.job_id = j.id "
        "and s.by_estimate)) t where rn <= :w order by stage, finished_at, id"
    )


STATE_COLUMNS = tuple("estimator stage revision allowance jobs mean m2 mean_input p50 p90 p99 fitted_at".split())
_STATE = f"select {', '.join(STATE_COLUMNS)} from estimator_state"
LEARNING_READ_STATE = _STATE + " order by estimator, stage"
LEARNING_READ_STATE_OF = _STATE + " where estimator = :e order by estimator, stage"
LEARNING_WRITE_STATE = (
    f"insert into estimator_state ({', '.join(STATE_COLUMNS)}) values ({', '.join(':' + c for c in STATE_COLUMNS)}) "
    "on conflict (estimator, stage) do update set "
    + ", ".join(f"{c} = excluded.{c}" for c in STATE_COLUMNS if c not in ("estimator", "stage"))
)


# -- waiters ---------------------------------------------------------------------------------------------
# The own-row read of a waiting job: what its waiter needs to hold the lease it was handed.
ROW_KEYS = tuple("id lane stage est attempt lease_token lease_until run_key rate_cost state reason admitted_at".split())
WAITERS_CLAIM = "update job set waiter = :w where id = :id and state = 'new'"
WAITERS_HEARTBEAT_UPDATE_WAITER = "update waiter set seen = :now, gone_at = null where id = :w"


WAITERS_HEARTBEAT_INSERT_WAITER = (
    "insert into waiter (id, seen) values (:w, :now) on conflict (id) "
    "do update set seen = excluded.seen, gone_at = null"
)


def waiters_gone(keys: Iterable[str]) -> str:
    """The waiters named by the parameters ``keys``."""
    return f"select id, seen, gone_at from waiter where id in ({_marks(keys)})"


def waiters_rows(keys: Iterable[str]) -> str:
    """The :data:`ROW_KEYS` of the jobs named by the parameters ``keys``."""
    return f"select {', '.join(ROW_KEYS)} from job where id in ({_marks(keys)})"


def waiters_rows_sent(keys: Iterable[str], slack: str) -> str:
    """PostgreSQL: :func:`waiters_rows`, and the leased ones' charges stamped sent at ``:now + slack``."""
    ids, at = _marks(keys), f":now + {slack}"
    return (
        f"with r as (select {', '.join(ROW_KEYS)} from job where id in ({ids})), "
        f"s as (update rate_charge c set at = greatest(c.at, {at}), sent = true from r join lane l on l.name = r.lane "
        f"where r.state = 'leased' and c.job_id = r.id and c.attempt = r.attempt and (c.at < {at} or not c.sent)) "
        f", sl as (update limit_charge c set at = greatest(c.at, {at}), "
        f"sent = true from r join lane l on l.name = r.lane "
        f"where r.state = 'leased' and c.job_id = r.id and c.attempt = r.attempt and (c.at < {at} or not c.sent)) "
        "select * from r"
    )


WAITERS_LEASE_EXPIRED = "select 1 from job where state = 'leased' and lease_until < :now limit 1"
WAITERS_TRY_TICK_LOCK = "select pg_try_advisory_xact_lock(:c, hashtext(current_schema() || '/' || :l))"
WAITERS_NOTIFY = "select pg_notify(:ch, current_schema() || '|' || :l || '|' || :w)"


# -- runs ------------------------------------------------------------------------------------------------
RUNS_LAPSE_SELECT_LANE_RUN = "select run_key, remaining from lane_run where lane = :l and expires_at <= :now"
RUNS_LAPSE_UPDATE_LANE_RUN = (
    "update lane_run set remaining = 0, expires_at = null where lane = :l and expires_at <= :now"
)
RUNS_LAPSE_UPDATE_LANE = "update lane set finishing = finishing - :f where name = :l"


def runs_runs_of(keys: Iterable[str]) -> str:
    """The runs of lane ``:l`` named by the parameters ``keys``."""
    return f"select run_key, remaining from lane_run where lane = :l and run_key in ({_marks(keys)})"


def runs_fits_of(keys: Iterable[str]) -> str:
    """The profile of lane ``:l`` for the stages named by the parameters ``keys``."""
    return (
        f"select stage, after_tokens, hold_seconds, runs from run_profile where lane = :l and stage in ({_marks(keys)})"
    )


RUNS_RECORD_INSERT_LANE_RUN = (
    "insert into lane_run (lane, run_key, started_at, stage, committed, remaining, last_at, expires_at) "
    "values (:l, :r, :now, :st, :c, :rem, :now, :exp) on conflict (lane, run_key) do update set "
    "stage = excluded.stage, committed = lane_run.committed + excluded.committed, "
    "remaining = excluded.remaining, last_at = excluded.last_at, expires_at = excluded.expires_at"
)
RUNS_RECORD_UPDATE_JOB = "update job set finishing = :t where lane = :l and run_key = :r and state in ('new', 'parked')"
RUNS_REFIT_SELECT_JOB = (
    "select j.run_key, j.stage, j.est, j.actual, j.admitted_at from job j join (select run_key from lane_run "
    "where lane = :l and expires_at is null order by last_at desc limit :n) r on r.run_key = j.run_key "
    "where j.lane = :l and j.admitted_at is not null order by j.run_key, j.admitted_at, j.created_at, j.id"
)
RUNS_REFIT_INSERT_RUN_PROFILE = (
    "insert into run_profile (lane, stage, after_tokens, hold_seconds, "
    "runs, fitted_at) values (:l, :s, :a, :h, :n, :now) "
    "on conflict (lane, stage) do update set after_tokens = "
    "excluded.after_tokens, hold_seconds = excluded.hold_seconds, "
    "runs = excluded.runs, fitted_at = excluded.fitted_at"
)
RUNS_REFIT_UPDATE_LANE_RUN = (
    "update lane_run set remaining = coalesce((select p.after_tokens from run_profile p where p.lane = lane_run.lane "
    "and p.stage = lane_run.stage), 0) where lane = :l and expires_at is not null"
)
RUNS_LATEST_ESTIMATES = "select est from job where lane = :l order by created_at desc limit :n"


RUNS_DRIFT_SAMPLE = (
    "select est, actual from settlement where lane = :l and not by_estimate and not late"
    " order by settled_at desc, id desc limit :n"
)
# ... of the settlements after the operator cleared the allowance (:c)
RUNS_DRIFT_SAMPLE_SINCE = (
    "select est, actual from settlement where lane = :l and not by_estimate and not late"
    " and settled_at > :c order by settled_at desc, id desc limit :n"
)


RUNS_REFIT_UPDATE_LANE = (
    "update lane set profile_at = :now, size_boundary = :b, drift = :d, drift_overrun = :o, drift_spread = :s, "
    "finishing = (select coalesce(sum(remaining), 0) from lane_run where lane = :l and expires_at is not null) "
    "where name = :l"
)


PROFILE_KEYS = ("stage", "after_tokens", "hold_seconds", "runs", "fitted_at")
RUNS_PROFILE = f"select {', '.join(PROFILE_KEYS)} from run_profile where lane = :l order by stage"


# -- schema ----------------------------------------------------------------------------------------------
SCHEMA_MIGRATION_LOCK = "select pg_advisory_lock(%s)"
SCHEMA_MIGRATION_UNLOCK = "select pg_advisory_unlock(%s)"


# -- rule 12's rooms (overtake.py) ----------------------------------------------------------------------------
# A job entering the queue of a lane with rule 12 on waits to be numbered (arrival_pos = -1) by the lane's next
# tick, as a job entering again does (a retry, a lease expired, a requeue, a fallback move): its old place would be
# read against counters that moved on without it. In a lane with the rule off it is not numbered (null).


def unnumbered(lane: str = "job.lane") -> str:
    """SET pieces for a job entering a queue again: to be numbered if ``lane`` (an expression over the row's old
    values) has rule 12 on, else not numbered."""
    on = f"(select l.overtake_slack from lane l where l.name = {lane}) is not null"
    return f"arrival_pos = case when {on} then -1 else null end, arrival_epoch = null, overtake_base = null"


UNNUMBERED = unnumbered()
# (within the partial indexes ix_job_rooms and ix_job_tenant_arrival)
_NUMBERED = "state = 'new' and arrival_pos is not null and arrival_pos > 0"
# The same for a read or write by epoch: only numbering sets arrival_epoch (unnumbered() clears it with the
# position; the audit's I7 checks it), and without ``arrival_pos > 0`` only ix_job_rooms can serve it (why: migration
# 0021).
_IN_EPOCH = "state = 'new' and arrival_pos is not null"
OVERTAKE_PENDING = (
    "select id, coalesce(rate_cost, est), tenant from job "
    "where lane = :l and state = 'new' and arrival_pos is not null and arrival_pos < 0 order by wait_since, id "
    "limit :k"
)
OVERTAKE_WAITING_RATE = f"select coalesce(sum(coalesce(rate_cost, est)), 0) from job where lane = :l and {_NUMBERED}"
OVERTAKE_TAKE_ARRIVALS = "update lane set arrivals = arrivals + :n where name = :l returning arrivals"


def overtake_ensure_epochs(n: int) -> str:
    """The counter rows of ``n`` (tenant, epoch) pairs a batch of arrivals is numbered into, created at 0 where
    missing, in one statement: parameters ``:l``, ``t0 e0``, ``t1 e1`` ..."""
    rows = ", ".join(f"(:l, :t{i}, :e{i}, 0)" for i in range(n))
    return f"insert into lane_epoch (lane, tenant, epoch, passed) values {rows} on conflict do nothing"


# The counters of the epochs a batch is numbered into (consecutive positions: a few epochs, each tenant's rows).
OVERTAKE_EPOCHS_PASSED = (
    "select tenant, epoch, passed from lane_epoch where lane = :l and epoch >= :lo and epoch <= :hi"
)
OVERTAKE_NUMBER_JOB = (
    "update job set arrival_pos = :p, arrival_epoch = :e, overtake_key = :k, overtake_base = :b, arrival_v = :v "
    "where id = :id and state = 'new'"
)


def overtake_number_jobs(n: int) -> str:
    """OVERTAKE_NUMBER_JOB for ``n`` jobs in one statement (PostgreSQL: a burst numbered in one round trip and one
    plan, not ``n`` updates): parameters ``id0 p0 e0 k0 b0 v0``, ``id1 ...``."""
    rows = ", ".join(f"(:id{i}, :p{i}, :e{i}, :k{i}, :b{i}, :v{i})" for i in range(n))
    return (
        f"with v (id, p, e, k, b, w) as (values {rows}) "
        "update job set arrival_pos = cast(v.p as bigint), arrival_epoch = cast(v.e as bigint), "
        "overtake_key = cast(v.k as bigint), overtake_base = cast(v.b as bigint), arrival_v = cast(v.w as bigint) "
        "from v where job.id = v.id and job.state = 'new'"
    )


OVERTAKE_POSITION = (
    "select case when state = 'new' and arrival_pos > 0 then arrival_pos end, tenant from job where id = :id"
)


def overtake_epochs(n: int) -> str:
    """The epochs of ``n`` tenants (``:t0`` ...: the tenants a tick's head holds), their counters and least bases, in
    one statement: one head of ix_job_rooms per epoch row."""
    tenants = ", ".join(f":t{i}" for i in range(n))
    return (
        "select e.tenant, e.epoch, e.passed, (select min(j.overtake_base) from job j where j.lane = e.lane "
        f"and j.tenant = e.tenant and j.arrival_epoch = e.epoch and j.{_IN_EPOCH.replace(' and ', ' and j.')}) "
        f"from lane_epoch e where e.lane = :l and e.tenant in ({tenants}) order by e.tenant, e.epoch"
    )


OVERTAKE_EPOCH_ROWS = (
    f"select arrival_pos, overtake_base from job where lane = :l and tenant = :t and arrival_epoch = :e and {_IN_EPOCH}"
)


def overtake_pass_epochs(n: int) -> str:
    """What ``n`` admissions passed, charged to the older epochs' counters in one statement: admission ``i``
    (tenant ``:t{i}``, own epoch ``:o{i}``, rate ``:r{i}``) adds its rate to every epoch of its tenant from ``:lo``
    up to, not including, ``:o{i}``."""
    adds = " + ".join(f"case when tenant = :t{i} and epoch < :o{i} then :r{i} else 0 end" for i in range(n))
    tenants = ", ".join(f":t{i}" for i in range(n))
    # Only the rows some admission adds to are written (a row of its tenant older than its epoch).
    some = " or ".join(f"(tenant = :t{i} and epoch < :o{i})" for i in range(n))
    return (
        f"update lane_epoch set passed = passed + {adds} "
        f"where lane = :l and tenant in ({tenants}) and epoch >= :lo and epoch < :top and ({some})"
    )


def overtake_pass_own_epochs(n: int, dialect: str = "postgresql") -> str:
    """The same admissions charged to the older waiting jobs of their own epochs (at most 63 rows each): admission
    ``i`` at position ``:p{i}`` takes ``:r{i}`` off the base of its tenant's (``:t{i}``) jobs of epoch ``:o{i}``
    before it."""
    subs = " + ".join(
        f"case when arrival_epoch = :o{i} and tenant = :t{i} and arrival_pos < :p{i} then :r{i} else 0 end"
        for i in range(n)
    )
    owns = ", ".join(f":o{i}" for i in range(n))
    tenants = ", ".join(f":t{i}" for i in range(n))  # (ix_job_rooms leads with the tenant: a range per epoch)
    some = " or ".join(f"(arrival_epoch = :o{i} and tenant = :t{i} and arrival_pos < :p{i})" for i in range(n))
    table = "job indexed by ix_job_rooms" if dialect == "sqlite" else "job"  # (SQLite may pick the older range)
    return (
        f"update {table} set overtake_base = overtake_base - ({subs}) where lane = :l and {_IN_EPOCH} "
        f"and tenant in ({tenants}) and arrival_epoch in ({owns}) and arrival_pos < :pmax and ({some})"
    )


# SQLite's planner may read these by ix_job_tenant_arrival's range of every older job: one epoch's rows, by
# ix_job_rooms.
OVERTAKE_EPOCH_ROWS_SQLITE = OVERTAKE_EPOCH_ROWS.replace("from job where", "from job indexed by ix_job_rooms where")
OVERTAKE_GIVE_BACK = f"update job set overtake_base = overtake_base + :x where id = :id and {_NUMBERED}"
OVERTAKE_FORGET_JOBS = f"update job set {UNNUMBERED} where lane = :l and state = 'new'"
OVERTAKE_FORGET_EPOCHS = "delete from lane_epoch where lane = :l"
OVERTAKE_DROP_EMPTY_EPOCHS = (
    "delete from lane_epoch where lane = :l and not exists (select 1 from job j where j.lane = lane_epoch.lane "
    "and j.tenant = lane_epoch.tenant and j.arrival_epoch = lane_epoch.epoch "
    f"and j.{_IN_EPOCH.replace(' and ', ' and j.')})"
)
OVERTAKE_DROP_EMPTY_EPOCHS_SQLITE = OVERTAKE_DROP_EMPTY_EPOCHS.replace(
    "from job j ", "from job j indexed by ix_job_rooms "
)
# The refit's p99 of the rate tokens waiting at the day's arrivals (what the keys read as Q).
OVERTAKE_ARRIVALS_SINCE = "select count(*) from job where lane = :l and created_at >= :since and arrival_v is not null"
OVERTAKE_ARRIVAL_V_AT = (
    "select arrival_v from job where lane = :l and created_at >= :since and arrival_v is not null "
    "order by arrival_v limit 1 offset :k"
)
OVERTAKE_SET_Q = "update lane set overtake_q = :q where name = :l"
OVERTAKE_START_DAY = "update lane set overtake_since = :t where name = :l and overtake_since is null"
# A job an intake wrote unnumbered while the rule was being turned on (it read the lane before): to be numbered.
OVERTAKE_SWEEP = "update job set arrival_pos = -1 where lane = :l and state = 'new' and arrival_pos is null"


# -- intake ----------------------------------------------------------------------------------------------
INTAKE_JOB_BY_KEY = f"select {JOB_COLS}, est_version from job where key = :k"


def intake_insert_job(dialect: str, cols: Iterable[str]) -> str:
    """A new job row of ``cols`` (parameters of the same names); no conflict target: a row already there
    with this id or key inserts nothing (the caller reads ``rowcount``)."""
    cols = list(cols)
    insert = "insert into job ({cols}) values ({vals}) on conflict do nothing"
    if dialect != "postgresql":
        insert = "insert or ignore into job ({cols}) values ({vals})"
    return insert.format(cols=", ".join(cols), vals=", ".join(":" + k for k in cols))


INTAKE_SUBMIT_INSERT_SHADOW_ESTIMATE = "insert into shadow_estimate (job_id, version, est) values (:j, :v, :e)"
INTAKE_WAITER_GONE = "select reason from job where id = :id"
INTAKE_REOPEN_UPDATE_LANE = (
    "update lane set reserved = reserved - :e, reserved_var = reserved_var - :v, leased = leased - 1 where name = :l"
)
INTAKE_REOPEN_DELETE_TAIL = "delete from tail where job_id = :id"
INTAKE_REOPEN_UPDATE_JOB = (
    "update job set state = 'new', attempt = :a, lease_token = null, lease_until = 0, "
    f"wait_since = :now, prio = :p, reason = null, finished_at = null, {UNNUMBERED} "
    "where id = :id and state = :st and attempt = :old"
)
INTAKE_RESOLVE_FALLBACK = "select name from lane where name = :n"


# -- status ----------------------------------------------------------------------------------------------
STATUS_REPORT_STATES_SELECT_LANE = "select reported_state from lane where name = :n"
STATUS_REPORT_STATES_UPDATE_LANE = "update lane set reported_state = :s where name = :n"
STATUS_LANE_STATUS = "select lane, state, count(*) from job where state in ('new', 'parked') group by lane, state"
STATUS_FAILED_LATELY = "select count(*) from settlement where lane = :l and settled_at >= :t and outcome = 'failed'"
STATUS_JOB_PLACE = "select prio, coalesce(rate_cost, est), waiter, reason from job where id = :id"
STATUS_WAITING = "select count(*) from job where lane = :l and state = 'new'"
STATUS_WAITING_AHEAD = (
    "select count(*) from job where lane = :l and state = 'new' and (prio < :p or (prio = :p and id < :id))"
)


# -- admitting -------------------------------------------------------------------------------------------
ADMITTING_RECORD_PREFLIGHT = (
    "update lane set preflight_ok = :ok, preflight_error = :err, preflight_at = :now where name = :l"
)


# -- limits_api ------------------------------------------------------------------------------------------
LIMITS_PAUSED_UNTIL = "select paused_until from lane where name = :l"
LIMITS_PAUSE_STATE = "select paused_until, probe_until from lane where name = :l"
# The probe after a pause ended: claimed by one gate of any process (the row's pause is the one it read, no
# probe out); its success (or its hold run out) reopens the lane; a gate that never sent gives it back.
LIMITS_PROBE_CLAIM = (
    "update lane set probe_until = :h where name = :l and paused_until = :e and paused_until <= :now "
    "and probe_until is null"
)
LIMITS_PROBE_REOPEN = "update lane set paused_until = null, probe_until = null where name = :l and paused_until = :e"
LIMITS_PROBE_GIVE_BACK = "update lane set probe_until = null where name = :l and paused_until = :e and probe_until = :h"


# -- wakeups ---------------------------------------------------------------------------------------------
def listen(channel: str) -> str:
    """PostgreSQL: this session hears the NOTIFYs on ``channel`` (an identifier: no parameter can name it)."""
    return f"listen {channel}"


CURRENT_SCHEMA = "select current_schema()"


# -- reads -----------------------------------------------------------------------------------------------
READS_JOB = f"select {', '.join(ALL_JOB_COLUMNS)} from job where id = :id"
TAIL_KEYS = ("job_id", "lane", "stage", "est", "reason", "parked_at", "deadline")
READS_TAIL = f"select {', '.join(TAIL_KEYS)} from tail order by parked_at, job_id"
READS_TAIL_OF_LANE = f"select {', '.join(TAIL_KEYS)} from tail where lane = :l order by parked_at, job_id"


def reads_settled_jobs(lane: bool, since: bool) -> str:
    """Settled jobs, of lane ``:lane`` and finished since ``:cut`` when asked."""
    where = ["j.state = 'done'"]
    if lane:
        where.append("j.lane = :lane")
    if since:
        where.append("j.finished_at >= :cut")
    return (
        "select j.id, j.lane, j.stage, j.est, coalesce(j.est_version, '-'), j.actual, coalesce(s.overage, 0), "
        "j.finished_at, j.est_input, coalesce(s.by_estimate, 0), j.rate_cost from job j left join (select job_id, "
        "sum(overage) as overage, max(case when by_estimate then 1 else 0 end) as by_estimate from settlement "
        f"group by job_id) s on s.job_id = j.id where {' and '.join(where)}"
    )


def reads_spend(lane: bool, since: bool) -> str:
    """Settlements in time order, of lane ``:lane`` and settled since ``:cut`` when asked."""
    where = (["lane = :lane"] if lane else []) + (["settled_at >= :cut"] if since else [])
    return (
        "select lane, settled_at, actual from settlement"
        + (f" where {' and '.join(where)}" if where else "")
        + (" order by settled_at, id")
    )


_SHADOW_ESTIMATES = (
    "select s.job_id, s.version, s.est from shadow_estimate s join job j on j.id = s.job_id where j.state = 'done'"
)
READS_SHADOW_ESTIMATES = _SHADOW_ESTIMATES
READS_SHADOW_ESTIMATES_OF_LANE = _SHADOW_ESTIMATES + " and j.lane = :lane"


def reads_estimator_samples(lane: bool) -> str:
    """Done jobs estimated by version ``:v``, first or as a shadow (of lane ``:lane`` when asked), but for
    those billed their estimate because no usage was found: their "actual" is a guess, it teaches nothing."""
    where = " and j.lane = :lane" if lane else ""
    where += " and not exists (select 1 from settlement x where x.job_id = j.id and x.by_estimate)"
    return (
        "select j.stage, j.est, j.actual, j.finished_at from job j where j.state = 'done' and j.est_version = :v"
        + where
        + " union all select j.stage, s.est, j.actual, j.finished_at from job j join shadow_estimate s "
        "on s.job_id = j.id where j.state = 'done' and s.version = :v" + where
    )


READS_HISTORY = (
    "select created_at, stage, est, actual, run_key, coalesce(rate_cost, est), tenant from job "
    "where state = 'done' and created_at >= :since order by created_at, id"
)
READS_QUERY_ONLY_ON = "pragma query_only = 1"
READS_QUERY_SAVEPOINT = "savepoint lane_rows"
READS_QUERY_ONLY_OFF = "pragma query_only = 0"
READS_ROLLBACK_QUERY = "rollback to savepoint lane_rows"
READS_UNLOCK_ALL = "select pg_advisory_unlock_all()"


# -- rates -----------------------------------------------------------------------------------------------
RATES_SLIDE_WITH_RATE_CHARGE = (
    "with gone as (delete from rate_charge where lane = :l and at <= :cut and sent returning cost) "
    "update lane set window_used = window_used - (select coalesce(sum(cost), 0) from gone), "
    "window_start = :cut where name = :l returning window_used"
)
RATES_SLIDE_DELETE_RATE_CHARGE = "delete from rate_charge where lane = :l and at <= :cut and sent returning cost"
RATES_SLIDE_UPDATE_LANE = "update lane set window_used = window_used - :f, window_start = :cut where name = :l"
RATES_CHARGE = "insert into rate_charge (job_id, attempt, lane, at, cost, sent) values (:j, :a, :l, :at, :c, :s)"


RATES_TRUE_UP_SELECT_RATE_CHARGE = (
    "select c.cost, c.lane from rate_charge c join lane l on l.name = c.lane "
    "where c.job_id = :j and c.attempt = :a and l.rate_basis = 'actual'"
)
RATES_TRUE_UP_SELECT_RATE_CHARGE_FOR_UPDATE = RATES_TRUE_UP_SELECT_RATE_CHARGE + " for update of c"  # PostgreSQL


RATES_TRUE_UP_UPDATE_RATE_CHARGE = "update rate_charge set cost = :c where job_id = :j and attempt = :a"
RATES_TRUE_UP_UPDATE_LANE = "update lane set window_used = window_used + :d where name = :l"


def _stamp(table: str, which: str) -> str:
    return (
        f"update {table} set at = case when at < :now then :now else at end, sent = :t "
        f"where job_id = :j and attempt = :a and {which}"
    )


# An attempt's charges in ``table`` (job :j, attempt :a) sent at :now, later only (rates.stamp); with
# ``pending_only`` True, only the charges still pending.
RATES_STAMP = {
    (table, pending_only): _stamp(table, "not sent" if pending_only else "(at < :now or not sent)")
    for table in ("rate_charge", "limit_charge")
    for pending_only in (False, True)
}


def send_slack_share(window: str) -> str:
    """PostgreSQL: the default send slack (rates.slack_for) of a lane whose window is the column ``window``."""
    return f"least(:slack, {window} * :share)"


def rates_drop_pending(keys: Iterable[str]) -> str:
    """The pending rate charges of the jobs named by the parameters ``keys``, deleted."""
    return f"delete from rate_charge where job_id in ({_marks(keys)}) and not sent returning lane, cost"


RATES_DROP_PENDING_UPDATE_LANE = "update lane set window_used = window_used - :c where name = :l"
RATES_STAMP_SENT = "select l.window_seconds from lane l join job j on j.lane = l.name where j.id = :j"
RATES_FREE_AT = (
    "select min(at) from (select at, sum(cost) over (order by at, job_id, attempt rows unbounded preceding) "
    "as freed from rate_charge where lane = :l and sent) as w where freed >= :x"
)
RATES_USED = "select coalesce(sum(cost), 0) from rate_charge where lane = :l and (at > :cut or not sent)"


# -- admission -------------------------------------------------------------------------------------------
# The head of one index, (lane, state, finishing, prio, id), read as two ranges: the waiting jobs of
# runs under way and the rest, each in priority order (finishing jobs must not hide behind starters).
_COLS = (
    "id, est, wait_since, run_key, stage, attempt, coalesce(rate_cost, est), prio, est_var, waiter, tenant, "
    "rate_input, rate_output, arrival_pos"
)


# A job waiting to be numbered by rule 12 (arrival_pos -1: it entered since the lane's tick numbered, or a burst
# past what one tick numbers) has no place yet: the head reads past it (overtake.py).
_PLACED = "and (arrival_pos is null or arrival_pos > 0) "


def _head_sql(only: str = "", placed: str = _PLACED) -> str:
    return (
        f"select * from (select {_COLS} from job where lane = :l and state = 'new' and finishing = :f {only}"
        f"{placed}order by prio, id limit :k) as other union all "
        f"select * from (select {_COLS} from job where lane = :l and state = 'new' and finishing = :t {only}"
        f"{placed}order by prio, id limit :k) as fin"
    )


def _per_tenant(sql: str) -> str:
    """The same head, of one tenant (:tn): read from the head of ix_job_tenant_queue / ix_job_tenant_gated."""
    return sql.replace("and state = 'new' and", "and tenant = :tn and state = 'new' and").replace(
        "indexed by ix_job_gated", "indexed by ix_job_tenant_gated"
    )


HEAD_SQL = _head_sql()
# The same head with the jobs still waiting to be numbered: what ``lane status`` explains (it does not tick, so a
# lane whose only waiting job entered since its last tick would read "ok" with work waiting).
STATUS_HEAD_SQL = _head_sql(placed="")
# The same head without the jobs nobody waits for (submitted from the CLI, or by a script that polls
# Ledger.acquire), but for :own (one such job, whose own poll ticks): what a tick that will not run
# them reads, reading past them in the index.
GATED_HEAD_SQL = _head_sql("and (waiter is not null or id = :own) ")
# Rule 12 (overtake.py): a tenant's oldest numbered waiting jobs, from the head of ix_job_tenant_arrival, read as
# candidates besides the head once some room of its is short of a burst (a job its tenant's rooms hold back may
# pass only them).
OVERTAKE_OLDEST = (
    f"select {_COLS} from job where lane = :l and tenant = :t and {_NUMBERED} order by arrival_pos limit :k"
)
# ... and with no :own job (a hand-off, a gate's or the watcher's tick): the same rows in the same order, read
# from the head of ix_job_gated (migration 0013), a partial index holding exactly the waiting gated jobs on
# (lane, finishing, prio, id), instead of walking ix_job_queue past every job nobody waits for (a lane with
# 20,000 CLI jobs queued read all of them at every settlement). SQLite is told the index (its planner, with
# no statistics, prefers ix_job_queue's longer prefix); INDEXED BY fails loudly, never scans, if it cannot.
WAITERS_HEAD_SQL = _head_sql("and waiter is not null ")
WAITERS_HEAD_SQLITE = WAITERS_HEAD_SQL.replace("from job where", "from job indexed by ix_job_gated where")
# Per tenant (a lane with several: lane_plugin.policy.fairness), the head of each tenant's queue.
TENANT_HEADS = {sql: _per_tenant(sql) for sql in (HEAD_SQL, GATED_HEAD_SQL, WAITERS_HEAD_SQL, WAITERS_HEAD_SQLITE)}


# Applying a choice: the lane's counters, re-checking the ceiling and the lease cap (a bug in the policy
# fails the transaction, never overspends), and the chosen jobs' leases.
ADMISSION_LANE_UPDATE = (
    "update lane set reserved = reserved + :t, leased = leased + :n, window_used = window_used + :r, "
    "finishing = finishing + :fd, reserved_var = reserved_var + :v, updated_at = :now "
    "where name = :l and spent + reserved + :t <= ceiling and leased + :n <= max_leased"
)
_LEASE_JOB = (
    "update job set state = 'leased', lease_until = :lu, lease_token = :tok, lease_attempt = attempt, "
    "admitted_at = coalesce(admitted_at, :now) where "
)


ADMISSION_LEASE_ONE = _LEASE_JOB + "id = :id and state = 'new'"
# PostgreSQL: all of it in one statement (data-modifying CTEs always run; the counts are checked after).
ADMISSION_LEASE_PG = (
    f"with l as ({ADMISSION_LANE_UPDATE} returning 1), "
    f"j as ({_LEASE_JOB}id = any(:ids) and state = 'new' returning 1), "
    "c as (insert into rate_charge (job_id, attempt, lane, at, cost, sent) select x.j, x.a, :l, :at, x.c, x.s "
    "from unnest(:js::text[], :atts::int[], :cs::bigint[], :ss::boolean[]) as x(j, a, c, s)), "
    "n as (select pg_notify(:ch, current_schema() || '|' || :l || '|' || :what) from l) "
    "select (select count(*) from l), (select count(*) from j), (select count(*) from n)"
)
ADMISSION_RENEW_SELECT_JOB = (
    "select j.state, j.lease_token, l.lease_seconds, j.lease_until from job j join lane l on l.name = j.lane "
    "where j.id = :id"
)
ADMISSION_RENEW_UPDATE_JOB = (
    "update job set lease_until = :u where id = :id and state = 'leased' and lease_token = :tok"
)


# -- settlement ------------------------------------------------------------------------------------------
def settlement_lane_updates(returning: str) -> dict[str, str]:
    """The statements of a settlement that return the lane's row (``returning``: its columns, lanes.RETURNING),
    built once when settlement is imported: ``live_pg``, PostgreSQL's one statement for the common case (the
    lane's lock, the job, its charges, the settlement row, the lane's counters and the tenant's); ``live`` and
    ``late``, the lane's counters after a live or a late attempt (the full path)."""
    return {
        "live_pg": (
            "with lk as (select name from lane where name = :l and period = :per and period_start >= :ps for update), "
            "j as (update job set state = :st, actual = actual + :a, finished_at = :now, lease_token = null "
            "where id = :id and lane = :l and state = 'leased' and attempt = :att and lease_attempt = :att "
            "and exists (select 1 from lk) returning est, est_var, tenant), "
            "c as (update rate_charge set sent = true, at = greatest(at, :now) where job_id = :id and attempt = :att "
            "and not sent and exists (select 1 from j)), "
            "cl as (update limit_charge set sent = true, at = greatest(at, :now) where job_id = :id and attempt = :att "
            "and not sent and exists (select 1 from j)), "
            "s as (insert into settlement (job_id, attempt, lane, est, actual, overage, late, by_estimate, outcome, "
            "settled_at) select :id, :att, :l, est, :a, greatest(:a - est, 0), false, :be, :out, :now from j "
            "on conflict do nothing returning est, overage), "
            "u as (update lane set spent = spent + :a, reserved = reserved - "
            "s.est, reserved_var = reserved_var - j.est_var, "
            "leased = leased - 1, overage = lane.overage + s.overage, updated_at = :now from j, s where lane.name = :l "
            f"returning s.est, s.overage, {returning}), "
            f"t as ({TENANTS_SETTLE_JOINED_SQL}) "
            "select (select count(*) from lk), (select count(*) from j), u.* from (select 1) as one left join u on true"
        ),
        "live": (
            "update lane set spent = spent + :a, reserved = reserved - :e, reserved_var = reserved_var - :v, "
            f"leased = leased - 1, overage = overage + :o, updated_at = :now where name = :l returning {returning}"
        ),
        "late": (
            f"update lane set spent = spent + :a, overage = overage + :o, updated_at = :now where name = :l "
            f"returning {returning}"
        ),
    }


SETTLEMENT_SETTLE_SELECT_SETTLEMENT = "select attempt, actual from settlement where job_id = :j"
SETTLEMENT_SETTLE_UPDATE_JOB = (
    "update job set state = :st, actual = actual + :a, finished_at = :now, lease_token = null "
    "where id = :id and state = 'leased' and attempt = :att"
)
SETTLEMENT_SETTLE_INSERT_SETTLEMENT = (
    "insert into settlement (job_id, attempt, lane, est, actual, overage, late, by_estimate, outcome, "
    "settled_at) values (:j, :att, :l, :e, :a, :o, :late, :be, :out, :now) on conflict do nothing"
)


SETTLEMENT_LATE_ACTUAL = "update job set actual = actual + :a where id = :id"


SETTLEMENT_SETTLE_LIVE = (
    "select j.lane, l.period, l.period_start, j.state = 'leased' and j.attempt = :att and "
    "j.lease_attempt = :att from job j join lane l on l.name = j.lane where j.id = :id"
)
SETTLEMENT_LOCK_LANES_LEFT = (
    "select distinct m.lane from lane_move m join job j on j.id = m.job_id "
    "where m.job_id = :j and m.lane < j.lane order by m.lane"
)
SETTLEMENT_FIRST_SETTLEMENT = (
    "select lane, est, actual, overage, late, outcome, by_estimate from settlement where job_id = :j and attempt = :a"
)


# -- upkeep ----------------------------------------------------------------------------------------------
UPKEEP_INSERT_TAIL = (
    "insert into tail (job_id, lane, stage, est, reason, parked_at, deadline) "
    "values (:job_id, :lane, :stage, :est, :reason, :parked_at, :deadline)"
)
UPKEEP_REAP_PARK_GATED = (
    "update job set state = 'parked', lease_token = null, lease_until = 0, finished_at = :now, "
    "reason = :why where lane = :l and state = 'leased' and lease_until < :now and waiter is not null "
    "returning id, stage, est, waiter, est_var"
)
UPKEEP_REAP_REQUEUE = (
    "update job set state = 'new', attempt = attempt + 1, lease_token = null, lease_until = 0, "
    f"reason = 'lease expired', {UNNUMBERED} where lane = :l and state = 'leased' and lease_until < :now "
    "and attempt < :max returning id, est, est_var"
)
UPKEEP_REAP_PARK_LAST_ATTEMPT = (
    "update job set state = 'parked', lease_token = null, lease_until = 0, finished_at = :now, "
    "reason = :why where lane = :l and state = 'leased' and lease_until < :now "
    "returning id, stage, est, est_var"
)
UPKEEP_REAP_UPDATE_LANE = (
    "update lane set reserved = reserved - :e, reserved_var = reserved_var - :v, leased = leased - :n, "
    "updated_at = :now where name = :l"
)
UPKEEP_DROP_WAITERS_UPDATE_WAITER = "update waiter set gone_at = :now where id = :w and gone_at is null"
UPKEEP_DROP_WAITERS_UPDATE_JOB = (
    "update job set state = 'parked', reason = :why, finished_at = :now where waiter = :w and state = 'new'"
    " returning id, lane, stage, est"
)
UPKEEP_DROP_WAITERS_UPDATE_JOB_OF_LANE = (
    "update job set state = 'parked', reason = :why, finished_at = :now where waiter = :w and state = 'new'"
    " and lane = :l returning id, lane, stage, est"
)
UPKEEP_PARK_OVERDUE = (
    "update job set state = 'parked', reason = 'deadline passed while waiting', finished_at = :now "
    "where lane = :l and state = 'new' and deadline < :now returning id, stage, est"
)
UPKEEP_EXPIRE_TAIL_DELETE_TAIL = "delete from tail where deadline < :now returning job_id, lane, stage, est, reason"
UPKEEP_EXPIRE_TAIL_UPDATE_JOB = "update job set state = 'failed', reason = :reason where id = :id and state = 'parked'"
UPKEEP_PARK = (
    "update job set state = 'parked', reason = :why, finished_at = :now where id = :id and state = 'new' and lane = :l"
)


UPKEEP_WAITING_JOBS = (
    "select id, est, rate_cost, rate_input, rate_output from job where lane = :l and state = 'new' order by id"
)
# ... but those whose rate cost is over the burst (:burst) or whose estimate is over the ceiling (:ceiling)
UPKEEP_WAITING_JOBS_OVER = (
    "select id, est, rate_cost, rate_input, rate_output from job where lane = :l and state = 'new' "
    "and (coalesce(rate_cost, est) > :burst or est > :ceiling) order by id"
)


UPKEEP_MOVE_TO_FALLBACK_SELECT_JOB = "select lane, fallback, state from job where id = :id"


# In its fallback lane a job gets the same time to wait again: otherwise park_overdue would
# park it there at once for the deadline it just missed in its first lane.
_FRESH_DEADLINE = "deadline = case when deadline is null then null else :now + (deadline - wait_since) end"
# ...and a place in its new lane's order (by that lane's size classes; :to the lane).
UNDER_WAY = "exists (select 1 from lane_run r where r.lane = :to and r.run_key = job.run_key)"


def fresh_place(prio: str) -> str:
    """The place in its new lane's order of a job moved there: ``prio`` (:func:`lane_priority`) and whether
    it finishes a run under way there."""
    return f"prio = {prio}, finishing = {UNDER_WAY}"


def upkeep_move_to_fallback_update_job(place: str) -> str:
    return (
        f"update job set lane = :fb, fallback = null, wait_since = :now, {_FRESH_DEADLINE}, {place}, "
        f"{unnumbered(':to')} "
        "where id = :id and state = 'new' and lane = :old returning id, lease_attempt, tenant"
    )


UPKEEP_FALL_BACK_WAITING_SELECT_JOB = (
    "select distinct fallback from job where lane = :l and state = 'new' and fallback is not null"
)


def upkeep_fall_back_waiting_update_job(place: str) -> str:
    return (
        f"update job set lane = fallback, fallback = null, wait_since = :now, {_FRESH_DEADLINE}, {place}, "
        f"{unnumbered('job.fallback')} "
        "where lane = :l and state = 'new' and fallback = :fb returning id, lease_attempt, tenant"
    )


UPKEEP_REQUEUE_SELECT_JOB = "select state, lane from job where id = :id"
UPKEEP_REQUEUE_DELETE_TAIL = "delete from tail where job_id = :id"


def upkeep_requeue_update_job(prio: str) -> str:
    return (
        f"update job set state = 'new', reason = null, finished_at = null, wait_since = :now, prio = {prio}, "
        f"{UNNUMBERED}, "
        "attempt = case when lease_attempt >= attempt then attempt + 1 else attempt end "
        "where id = :id and state = 'parked'"
    )


UPKEEP_DROP_SELECT_JOB = "select state from job where id = :id"
UPKEEP_DROP_DELETE_TAIL = "delete from tail where job_id = :id"
UPKEEP_DROP_UPDATE_JOB = (
    "update job set state = 'failed', reason = 'dropped from the tail', finished_at = :now "
    "where id = :id and state = 'parked'"
)


# -- audit -----------------------------------------------------------------------------------------------
AUDIT_LEASED_BY_LANE = (
    "select lane, count(*), coalesce(sum(est), 0), coalesce(sum(est_var), 0) from job "
    "where state = 'leased' group by lane"
)
AUDIT_SPENT_SINCE = (
    "select coalesce(sum(actual), 0), coalesce(sum(overage), 0) from settlement where lane = :l and settled_at >= :p"
)
AUDIT_WINDOW_AND_FINISHING = (
    "select (select coalesce(sum(cost), 0) from rate_charge where lane = :l), (select coalesce(sum(remaining), "
    "0) from lane_run where lane = :l and expires_at is not null)"
)
AUDIT_LIMIT_USED = (
    "select l.lane, l.unit, l.used, coalesce((select sum(c.cost) from limit_charge c where c.lane = l.lane "
    "and c.unit = l.unit), 0) from lane_limit l"
)
AUDIT_DOUBLE_SETTLEMENTS = (
    "select job_id, attempt, count(*) from settlement group by job_id, attempt having count(*) > 1"
)
AUDIT_ACTUAL_MISMATCH = (
    "select j.id, j.actual, coalesce(s.total, 0) from job j left join (select job_id, sum(actual) as total "
    "from settlement group by job_id) s on s.job_id = j.id where j.actual != coalesce(s.total, 0) limit 20"
)
AUDIT_STRAY_PENDING_CHARGES = (
    "select c.job_id, c.attempt, c.lane, j.state from rate_charge c left join job j on j.id = c.job_id "
    "where not c.sent and (j.id is null or j.state != 'leased' or j.attempt != c.attempt) limit 20"
)
AUDIT_ORPHAN_SETTLEMENTS = (
    "select s.job_id from settlement s left join job j on j.id = s.job_id where j.id is null limit 5"
)
AUDIT_PARKED_WITHOUT_TAIL = (
    "select j.id from job j left join tail t on t.job_id = j.id where j.state = 'parked' "
    "and (t.job_id is null or t.deadline is null) limit 20"
)
AUDIT_TAIL_NOT_PARKED = (
    "select t.job_id, j.state from tail t left join job j on j.id = t.job_id "
    "where j.state is null or j.state != 'parked' limit 20"
)
AUDIT_EXPIRED_LEASES = "select id, lease_until from job where state = 'leased' and lease_until < :cut limit 20"
AUDIT_TENANTS = "select lane, name, spent, ceiling, period_start from tenant"
# Rule 12 (overtake.py): no numbered waiting job was passed by more than its key (its room went negative), and
# every one has its epoch's counter.
AUDIT_ROOMS = (
    "select j.id, j.lane, j.overtake_key, j.overtake_base - e.passed, j.arrival_epoch from job j "
    "left join lane_epoch e on e.lane = j.lane and e.tenant = j.tenant and e.epoch = j.arrival_epoch "
    "where j.state = 'new' and j.arrival_pos > 0 and (e.epoch is null or j.overtake_base < e.passed) "
    "order by j.lane, j.arrival_pos limit 20"
)
# Only numbering sets an epoch (unnumbered() clears both): rule 12's reads by epoch (_IN_EPOCH) rely on it.
AUDIT_EPOCH_UNNUMBERED = (
    "select id, lane, arrival_pos, arrival_epoch from job where state = 'new' and arrival_epoch is not null "
    "and (arrival_pos is null or arrival_pos <= 0) order by lane, id limit 20"
)
AUDIT_TENANT_SPEND = (
    "select coalesce(sum(s.actual), 0), coalesce(sum(s.overage), 0), (select coalesce(sum(est), 0) from job "
    "where lane = :l and tenant = :t and state = 'leased') from settlement s join job j on j.id = s.job_id "
    "where s.lane = :l and j.tenant = :t and s.settled_at >= :p"
)
AUDIT_ATTEMPT_OUT_OF_RANGE = (
    "select s.job_id, s.attempt, j.lease_attempt from settlement s join job j on j.id = s.job_id "
    "where s.attempt < 1 or s.attempt > j.lease_attempt limit 20"
)
AUDIT_SETTLEMENT_SPLIT_WRONG = (
    "select s.job_id, s.attempt, s.est, s.actual, s.overage, s.late, j.est from settlement s "
    "join job j on j.id = s.job_id where (s.late = :f and (s.est != j.est or s.overage != "
    "case when s.actual > j.est then s.actual - j.est else 0 end)) "
    "or (s.late = :t and (s.est != 0 or s.overage != s.actual)) limit 20"
)
AUDIT_DONE_UNSETTLED = (
    "select j.id from job j left join settlement s on s.job_id = j.id and s.attempt = j.attempt "
    "and s.late = :f where j.state = 'done' and s.job_id is null limit 20"
)
AUDIT_LEASE_INCONSISTENT = (
    "select j.id, j.attempt, j.lease_attempt, j.lease_token from job j left join settlement s "
    "on s.job_id = j.id and s.attempt = j.attempt where j.state = 'leased' and "
    "(j.lease_token is null or j.lease_attempt != j.attempt or s.job_id is not null) limit 20"
)
AUDIT_JOBS_WITHOUT_LANE = (
    "select j.id, j.lane from job j left join lane l on l.name = j.lane where l.name is null limit 20"
)
AUDIT_SETTLEMENTS_WITHOUT_LANE = (
    "select s.job_id, s.lane from settlement s left join lane l on l.name = s.lane where l.name is null limit 20"
)


# -- tenants ---------------------------------------------------------------------------------------------
TENANTS_ENSURE = "insert into tenant (lane, name, updated_at) values (:l, :n, :now) on conflict do nothing"


_TENANT_COLS = "name, weight, served, ceiling, period, period_start, spent, backlogged"
TENANTS_OF_LANE = f"select {_TENANT_COLS} from tenant where lane = :l"
TENANTS_LISTING = f"select lane, {_TENANT_COLS} from tenant  order by lane, name"
TENANTS_LISTING_OF_LANE = f"select lane, {_TENANT_COLS} from tenant where lane = :l order by lane, name"


TENANTS_OF_LANE_UPDATE_TENANT = "update tenant set spent = 0, period_start = :ps where lane = :l and name = :n"
TENANTS_RESERVED_OF = "select tenant, sum(est) from job where lane = :l and state = 'leased' group by tenant"
TENANTS_SET_SERVED = "update tenant set served = :s where lane = :l and name = :n"
TENANTS_SET_BACKLOGGED = "update tenant set backlogged = :b where lane = :l and name = :n"
TENANTS_CHARGE = (
    "update tenant set served = served + :d, updated_at = :now where lane = :l and name = :n "
    "and (ceiling is null or spent + :r + :t <= ceiling)"
)
_TENANT_SETTLE = (
    "update tenant set spent = case when period = 'none' or period_start >= "
    "(case period when 'daily' then :pd else :pm end) then spent + :a else :a end, "
    "period_start = case period when 'none' then period_start when 'daily' then :pd else :pm end, "
    # A counter is never below 0: a lone tenant without a budget is not charged at admission (nothing to be
    # fair against), so the true-up of its estimates down to its actuals would take it below.
    "served = case when served + ({served}) / weight < 0 then 0 else served + ({served}) / weight end {where}"
)
TENANTS_SETTLE_SQL = _TENANT_SETTLE.format(served=":a - :e", where="where lane = :l and name = :n")
# The same in PostgreSQL's one-statement settlement (lane_plugin.ledger.settlement), from its ``j`` (the job's
# UPDATE ... RETURNING est, est_var, tenant): only if that settled the live lease.
TENANTS_SETTLE_JOINED_SQL = _TENANT_SETTLE.format(
    served=":a - j.est", where="from j where tenant.lane = :l and tenant.name = j.tenant"
)
TENANTS_SET_TENANT_SELECT_TENANT = "select name from tenant where lane = :l order by name"
TENANTS_SET_TENANT_SELECT_SETTLEMENT = (
    "select coalesce(sum(s.actual), 0) from settlement s join job j on j.id = s.job_id "
    "where s.lane = :l and j.tenant = :n and s.settled_at >= :p"
)


def tenants_update(cols: Iterable[str]) -> str:
    """Tenant ``:n`` of lane ``:l``: ``cols`` set from the parameters of their names, ``updated_at`` :now."""
    return f"update tenant set {_assign(cols)}, updated_at = :now where lane = :l and name = :n"


TENANTS_LISTING_SELECT_JOB = "select tenant, count(*) from job where lane = :l and state = 'new' group by tenant"
TENANTS_LISTING_SELECT_SETTLEMENT = (
    "select j.tenant, sum(s.actual) from settlement s join job j on j.id = s.job_id "
    "where s.lane = :l and s.settled_at > :since group by j.tenant"
)


# -- lanes -----------------------------------------------------------------------------------------------
def lane_priority(wait: str, finishing: str, size_classes: bool) -> str:
    """A job's place in its lane's order (lane_plugin.policy.order.priority) as an SQL expression over
    ``job.est``, ``wait`` (a column or a parameter) and ``finishing`` (a column or an expression), with the
    parameters :prio_f (the age factor) and, with ``size_classes``, :prio_b (the boundary), :prio_w."""
    if not size_classes:
        return f"{wait} + est * :prio_f"
    return f"{wait} + case when {finishing} then est * :prio_f when est > :prio_b then :prio_w else 0 end"


def lane_reads(cols: Iterable[str]) -> dict[str, str]:
    """The reads of lane rows (``cols``): ``one`` by name (:n), ``lock`` it too (PostgreSQL: FOR UPDATE; SQLite's
    BEGIN IMMEDIATE holds every lane), ``all`` by name, ``all_locked``. Built once, when lanes is imported."""
    select = "select " + ", ".join(cols) + " from lane"
    return {
        "one": select + " where name = :n",
        "lock": select + " where name = :n" + " for update",
        "all": select + " order by name",
        "all_locked": select + " order by name" + " for update",
    }


LANES_NAMES = "select name from lane order by name"


def lanes_roll_counters(cols: Iterable[str]) -> str:
    """Lane ``:name``'s ``cols`` set from the parameters of their names."""
    return f"update lane set {_assign(cols)} where name = :name"


def lanes_insert_lane(cols: Iterable[str]) -> str:
    """A new lane row of ``cols`` (parameters of the same names); nothing if the name is taken."""
    cols = list(cols)
    return f"insert into lane ({', '.join(cols)}) values ({_marks(cols)}) on conflict (name) do nothing"


def lanes_update_settings(cols: Iterable[str]) -> str:
    """Lane ``:name``'s settings ``cols`` set from the parameters of their names, ``updated_at`` :now."""
    return f"update lane set {_assign(cols)}, updated_at = :now where name = :name"


LANES_REPOINT_PERIOD_SELECT_SETTLEMENT = (
    "select coalesce(sum(actual), 0), coalesce(sum(overage), 0) from settlement where lane = :l and settled_at >= :p"
)
LANES_REPOINT_PERIOD_UPDATE_LANE = "update lane set period_start = :p, spent = :s, overage = :o where name = :l"
LANES_CLEAR_DRIFT_SELECT_SETTLEMENT = "select max(settled_at) from settlement where lane = :n"
LANES_CLEAR_DRIFT_UPDATE_LANE = (
    "update lane set drift = 1.0, drift_overrun = 0, drift_spread = 0, drift_cleared_at = :c, "
    "updated_at = :now where name = :n"
)


def lanes_reprioritise(prio: str) -> str:
    """Every waiting or parked job of lane ``:l`` placed by ``prio`` (:func:`lane_priority`)."""
    return f"update job set prio = {prio} where lane = :l and state in ('new', 'parked')"


LANES_DELETE_LANE_SELECT_JOB = "select count(*) from job where lane = :n"
LANES_DELETE_LANE_SELECT_LANE_MOVE = "select count(*) from lane_move where lane = :n"
LANES_DELETE_LANE_SELECT_LANE = "select name from lane where fallback = :n order by name"


# A lane's rows in the other tables, deleted with it (lanes.delete_lane).
LANES_DELETE_ROWS = {
    table: f"delete from {table} where lane = :n"
    for table in ("lane_run", "rate_charge", "run_profile", "tenant", "lane_epoch")
}


LANES_DELETE_LANE_DELETE_LANE = "delete from lane where name = :n"


# -- limits ----------------------------------------------------------------------------------------------
LIMITS_SLIDE_SELECT_LANE_LIMIT = (
    "select unit, amount, window_seconds, used, window_start from lane_limit where lane = :l"
)
LIMITS_SLIDE_DELETE_LIMIT_CHARGE = (
    "delete from limit_charge where lane = :l and unit = :u and at <= :cut and sent returning cost"
)
LIMITS_SLIDE_UPDATE_LANE_LIMIT = (
    "update lane_limit set used = used - :f, window_start = :cut where lane = :l and unit = :u"
)
LIMITS_CHARGE_INSERT_LIMIT_CHARGE = (
    "insert into limit_charge (job_id, attempt, unit, lane, at, cost, sent) values (:j, :a, :u, :l, :at, :c, :s)"
)
LIMITS_CHARGE_UPDATE_LANE_LIMIT = "update lane_limit set used = used + :n where lane = :l and unit = :u"


def limits_drop_pending(keys: Iterable[str]) -> str:
    """The pending limit charges of the jobs named by the parameters ``keys``, deleted."""
    return f"delete from limit_charge where job_id in ({_marks(keys)}) and not sent returning lane, unit, cost"


LIMITS_DROP_PENDING_UPDATE_LANE_LIMIT = "update lane_limit set used = used - :c where lane = :l and unit = :u"
LIMITS_TRUE_UP_OUTPUT_SELECT_LIMIT_CHARGE = (
    "select c.cost, c.lane, coalesce(j.rate_input, 0) from limit_charge c join job j on j.id = c.job_id "
    "where c.job_id = :j and c.attempt = :a and c.unit = :u"
)
LIMITS_TRUE_UP_OUTPUT_UPDATE_LIMIT_CHARGE = (
    "update limit_charge set cost = :c, at = case when at < :now then :now else at end "
    "where job_id = :j and attempt = :a and unit = :u"
)
LIMITS_RECHARGE_OUTPUT_SELECT = (
    "select coalesce(j.rate_input, 0) from job j join lane_limit m on m.lane = :l and m.unit = :u where j.id = :j"
)
LIMITS_TRUE_UP_OUTPUT_UPDATE_LANE_LIMIT = "update lane_limit set used = used + :d where lane = :l and unit = :u"
LIMITS_FREE_AT = (
    "select min(at) from (select at, sum(cost) over (order by at, job_id, attempt rows unbounded preceding) "
    "as freed from limit_charge where lane = :l and unit = :u and sent) as w where freed >= :x"
)
LIMITS_SET_BURST = "update lane set burst_tokens = :b, window_seconds = :w, updated_at = :now where name = :n"
LIMITS_SET_LIMITS_DELETE_LIMIT_CHARGE = "delete from limit_charge where lane = :l and unit = :u"
LIMITS_SET_LIMITS_DELETE_LANE_LIMIT = "delete from lane_limit where lane = :l and unit = :u"
LIMITS_SET_LIMITS_UPDATE_LANE_LIMIT = (
    "update lane_limit set amount = :a, window_seconds = :w where lane = :l and unit = :u"
)
LIMITS_SET_LIMITS_INSERT_LANE_LIMIT = (
    "insert into lane_limit (lane, unit, amount, window_seconds, used, window_start) values (:l, :u, :a, :w, 0, 0)"
)
LIMITS_SET_SPEC = "update lane set limit_spec = :s, updated_at = :now where name = :n"
LIMITS_PAUSE_UPDATE_JOB = "update job set rate_limited = rate_limited + 1 where id = :id"
LIMITS_PAUSE_UPDATE_LANE = (
    "update lane set paused_until = :u, paused_reason = :r, probe_until = null, updated_at = :now where name = :l"
)


def _true_up(tokens: bool) -> dict[str, str]:
    table = "rate_charge" if tokens else "limit_charge"
    where = "lane = :l" if tokens else "lane = :l and unit = :u"
    if tokens:
        hold = "insert into rate_charge (job_id, attempt, lane, at, cost, sent) values (:j, 0, :l, :at, :c, :s)"
        count = "update lane set window_used = window_used + :c where name = :l"
    else:
        hold = (
            "insert into limit_charge (job_id, attempt, unit, lane, at, cost, sent) values (:j, 0, :u, :l, :at, :c, :s)"
        )
        count = "update lane_limit set used = used + :c where lane = :l and unit = :u"
    return {
        "last_sent": f"select max(at) from {table} where job_id = :j and sent{'' if tokens else ' and unit = :u'}",
        "own_sent": (
            "select coalesce(sum(case when job_id like 'provider:%' or not sent or at > :asof or at <= :lo "
            "or job_id = :r then 0 "
            f"else cost end), 0), count(case when job_id like 'provider:%' then null else 1 end) from {table} "
            f"where {where}"
        ),
        "held": f"select cost, at from {table} where job_id = :j and {where}",
        "rehold": f"update {table} set cost = :c, at = :at where job_id = :j and {where}",
        "hold": hold,
        "count": count,
    }


# limits.true_up_remaining's statements (the provider's count, as one outside-spend charge per window), for
# the burst window's rate_charge (True: unit ``tokens``) or a limit's limit_charge (False: unit :u): the last
# send of the counted job (:j), what the lane sent in its window (:lo, :asof]; :r a refused request's job), the
# ``provider:LANE`` charge held, re-dated and re-sized or written, and the window's count moved by :c.
LIMITS_TRUE_UP = {tokens: _true_up(tokens) for tokens in (True, False)}


LIMITS_LIMIT_STATUS_SELECT_LIMIT_CHARGE = (
    "select coalesce(sum(cost), 0) from limit_charge where lane = :l and unit = :u and (at > :cut or not sent)"
)


def _freed_at(tokens: bool) -> str:
    return (
        "select min(at) from (select at, sum(cost) over (order by at, job_id, attempt rows "
        f"unbounded preceding) as freed from {'rate_charge' if tokens else 'limit_charge'} "
        f"where lane = :l {'' if tokens else 'and unit = :u '}and sent and at > :cut) "
        "as w where freed >= :x"
    )


# When lane :l's window of ``tokens`` (or of unit :u) will have freed :x (limits.limit_status).
LIMITS_FREED_AT_TOKENS = _freed_at(True)
LIMITS_FREED_AT = _freed_at(False)


# -- db --------------------------------------------------------------------------------------------------
def sqlite_busy_timeout(ms: int) -> str:
    """SQLite: how long a statement waits for another writer's lock, in milliseconds."""
    return f"pragma busy_timeout={int(ms)}"


SQLITE_WAL = "pragma journal_mode=wal"
SQLITE_SYNCHRONOUS_NORMAL = "pragma synchronous=normal"
SQLITE_BEGIN_WRITE = "begin immediate"  # the database's writer lock, taken at once
SQLITE_BEGIN_READ = "begin"


DB_TABLES_SELECT_SQLITE_MASTER = "select name from sqlite_master where type='table'"
DB_TABLES_SELECT_PG_TABLES = "select tablename from pg_tables where schemaname = current_schema()"
DB_REVISION = "select version_num from alembic_version"


# -- intake ----------------------------------------------------------------------------------------------
# -- reads -----------------------------------------------------------------------------------------------
READS_READ_ONLY = "set transaction read only"  # PostgreSQL; SQLite: READS_QUERY_ONLY_ON
