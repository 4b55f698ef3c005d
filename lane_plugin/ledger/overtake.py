"""Rule 12 in the ledger: each waiting job's room, kept per arrival epoch (lane setting ``overtake_slack``).

With ``overtake_slack = c`` set on a lane (1.25 by default; ``lane lanes set LANE --overtake-slack off`` turns it
off), a job that enters its queue waits to be numbered (``arrival_pos = -1``, :data:`PENDING`); the lane's next tick,
under its lock and before it admits anything, numbers those jobs in the order they entered (:func:`number`):
each gets its *position* and a key, ``max((c - 1) V, c Q - V)`` (:func:`lane_plugin.policy.slack.slack_key`),
``V`` the rate tokens waiting before it and ``Q`` the lane's p99 of ``V`` learned from a day of its arrivals
(:func:`refit`). No job is admitted between its intake and that tick, so it gets the place and (at most) the ``V``
it would have had at intake.

*The learning day.* Until ``Q`` is learned the keys are :data:`UNBOUNDED`: the lane numbers its arrivals and keeps
their ``V`` but holds nobody back, so its first day runs in the order alone (admission reads and charges no rooms:
none could bind, and the first ``Q`` learned numbers the waiting jobs afresh). Keys from a ``Q`` not yet learned
would be the pointwise ``(c - 1) V`` (a running ``Q`` on a backlog that grows is the present backlog), which
measured costs the p50 (Azure code trace 0.91x token-fifo's, target 0.5x) and holds a tenant that arrives to a
backlog behind it (the backfill-vs-interactive case leased the interactive at places 6 to 25, not within 20). The
refit learns ``Q`` once the rule has been on for :data:`LEARN_SECONDS` (``lane.overtake_since``) with
:data:`~lane_plugin.policy.slack.QUANTILE_WARMUP` arrivals; ``overtake_q`` set on the lane seeds it (a lane like
it, or 0 for the pointwise keys at once) until then. A job entering again (a retry, an expired
lease, a requeue, a fallback move) is numbered afresh the same way, as a new arrival.

Admission (:func:`lane_plugin.policy.admit`, rule 12's exact form, :mod:`lane_plugin.policy.perjob`) lets a job
pass older waiting jobs only while each keeps room for it, so the rate tokens of younger jobs admitted while a job
waits and could go never pass its key, and the lane's p99 of tokens ahead stays within ``c`` times token-fifo's
(the proof and its terms: :mod:`lane_plugin.policy.slack`). A stage of a run under way is neither held nor
charged (runs under way finish first, rule 4: held behind the first stages their reserve keeps out, neither would
go, and a budget-bound week stalled). A job that cannot go this tick whatever the order does (held by its tenant's
budget, waiting for the period to reset, or, in a gate's tick, a job nobody waits for) does not hold the others
back, and what passes it then is given back (``Decision.exempt``).

The rooms are kept per tenant (a job is charged only for the passes of its own tenant's younger jobs: between
tenants the fair merge orders, with its own bound; :mod:`lane_plugin.policy.perjob`, "With tenants"), exactly, in
bounded work, by epochs of :data:`EPOCH` consecutive positions of the lane's arrival order
(:class:`lane_plugin.sim.rooms.EpochRooms` is the same structure in memory, tested against a segment tree):

- ``lane_epoch.passed``: per tenant and epoch with a waiting job of it, the rate tokens its tenant's younger jobs
  took ahead of all of it;
- ``job.overtake_base``: per numbered waiting job, its key plus its epoch's counter when it was numbered, so its
  room is ``overtake_base - passed``;
- a tick's admissions add their rates to the counters of their tenants' older epochs (one UPDATE over the epoch
  rows the waiting jobs span) and take them off the base of their tenants' older jobs of their own epochs (one
  UPDATE, at most ``EPOCH - 1`` rows each);
- an epoch's least room is the head of ``ix_job_rooms`` less its counter; an epoch a range covers in part is
  read row by row (at most ``EPOCH`` rows, once per tick).

A tick that numbers new arrivals also sums the rate tokens of the numbered waiting jobs (``V``): a read of the
lane's waiting jobs, once per tick with arrivals, never per intake.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

from .. import checks
from ..errors import InvalidInput
from ..policy.fairness import DEFAULT_TENANT
from ..policy.slack import LEARN_SECONDS, QUANTILE_WARMUP, SLACK_QUANTILE, UNBOUNDED, slack_key
from . import queries
from .db import Cursor

# Positions per epoch: with the square root of the jobs waiting both an admission's epoch counters and its
# rows stay a few dozen (64: up to about 4,000 waiting; measured in docs/admission.md).
EPOCH = 64
# Above any room: an epoch (or a range) with no waiting job.
NONE = 1 << 62
# The place of a job waiting to be numbered by its lane's next tick (it entered since, or again).
PENDING = -1
# At most this many arrivals numbered by one tick (a burst of intakes is numbered over a few ticks, oldest first:
# the rest wait for the next, without a place, so nobody passes them and they pass nobody): the tick stays short.
NUMBER_PER_TICK = 512


# The lane settings of the rule: a change of either numbers the waiting jobs afresh (restart).
SETTINGS = ("overtake_slack", "overtake_q")


def checked(key: str, value):
    """A rule 12 setting as given to ``lane lanes set``: ``overtake_slack`` 1 to 10 (None or "off": off),
    ``overtake_q`` a whole number of rate tokens >= 0 (None: forget it, learn a day afresh). Raises InvalidInput."""
    if key == "overtake_slack":
        off = value is None or (isinstance(value, str) and value.strip().lower() == "off")
        return None if off else checks.number(key, value, low=1.0, high=10.0)
    return None if value is None else checks.whole(key, value, low=0)


def setting_change(was: float | None, clean: dict, now: float) -> dict:
    """What else a change of the lane's settings ``clean`` writes for the rule, whose slack was ``was`` (None: off).

    The rule learns ``Q`` from a day of arrivals from when it was turned on (``overtake_since``), or from when a
    seeded ``Q`` was forgotten (``overtake_q`` set to None); turned off, it forgets when. Turned on, a ``Q`` from
    before (learned while it was last on) is forgotten too, unless one is seeded in the same change: the lane learns
    a day afresh rather than binding at once on an old one. A seed for a lane whose rule is off is refused.
    """
    slack = clean.get("overtake_slack", was)
    if slack is None:
        if clean.get("overtake_q") is not None:
            raise InvalidInput(
                "overtake_q", clean["overtake_q"], "rule 12 is off on this lane: set overtake_slack with it"
            )
        return {"overtake_since": None} if was is not None else {}
    if was is None:
        return {"overtake_since": now} if "overtake_q" in clean else {"overtake_since": now, "overtake_q": None}
    if "overtake_q" in clean and clean["overtake_q"] is None:
        return {"overtake_since": now}
    return {}


def number(cur: Cursor, lane: str, *, slack: float, q: int | None) -> int:
    """Number the jobs waiting to be (``arrival_pos = -1``: entered since the lane's last tick, or again), in the
    order they entered, under the lane's lock (the tick's): each gets the next position, and its key from ``V``, the
    rate tokens waiting before it (the numbered ones, and those of this batch before it), ``slack`` and the learned
    ``q`` (None: not yet learned, the keys are :data:`UNBOUNDED`). Returns how many were numbered.

    Numbering at the tick rather than at intake gives each job the same place and a ``V`` no larger: no job is
    admitted between its intake and the lane's next tick (admission is a tick), and a job parked meanwhile only
    lowers ``V`` (a smaller key: the cautious side).
    """
    pending = cur.all(queries.OVERTAKE_PENDING, {"l": lane, "k": NUMBER_PER_TICK})
    if not pending:
        return 0
    waiting = int(cur.scalar(queries.OVERTAKE_WAITING_RATE, {"l": lane}))
    last = int(cur.scalar(queries.OVERTAKE_TAKE_ARRIVALS, {"l": lane, "n": len(pending)}))
    first = last - len(pending) + 1
    # The (tenant, epoch) counters the batch is numbered into (the rooms are per tenant): created where missing and
    # read in two statements, whatever the number of tenants.
    pairs = sorted({(tenant, (first + i) // EPOCH) for i, (_, _, tenant) in enumerate(pending)})
    params: dict[str, object] = {"l": lane}
    for i, (tenant, epoch) in enumerate(pairs):
        params[f"t{i}"], params[f"e{i}"] = tenant, epoch
    cur.execute(queries.overtake_ensure_epochs(len(pairs)), params)
    span = {"l": lane, "lo": first // EPOCH, "hi": last // EPOCH}
    counters = {(t, int(e)): int(p) for t, e, p in cur.all(queries.OVERTAKE_EPOCHS_PASSED, span)}
    rows = []
    for i, (job_id, rate, tenant) in enumerate(pending):
        position = first + i
        epoch = position // EPOCH
        key = UNBOUNDED if q is None else slack_key(waiting, q, slack)
        base = key + counters[tenant, epoch]
        rows.append({"id": job_id, "p": position, "e": epoch, "k": key, "b": base, "v": waiting})
        waiting += int(rate)
    if cur.dialect == "postgresql":  # one statement for the batch (bench_overtake.py: the tick numbering 512)
        params = {f"{name}{i}": value for i, row in enumerate(rows) for name, value in row.items()}
        cur.execute(queries.overtake_number_jobs(len(rows)), params)
    else:  # SQLite: the same updates in process, no round trips to save (and UPDATE ... FROM needs 3.33)
        cur.executemany(queries.OVERTAKE_NUMBER_JOB, rows)
    return len(rows)


class Rooms:
    """The lane's rooms as the tick found them (:class:`lane_plugin.policy.perjob.Rooms`), per tenant, read on demand.

    Nothing this tick writes is read back: the admissions' charges are written by :func:`passed` once the
    policy has decided (it accounts for them within the tick itself).
    """

    def __init__(self, cur: Cursor, lane: str) -> None:
        self.cur, self.lane = cur, lane
        self._positions: dict[str, int | None] = {}  # seeded from the head rows (:meth:`known`)
        self._tenants: dict[str, str] = {}
        self._epochs: dict[str, _TenantEpochs] = {}  # per tenant, read when first asked
        self._rows: dict[tuple[str, int], list[tuple[int, int]]] = {}  # (tenant, epoch) -> (position, base) waiting

    def known(self, rows: Iterable) -> None:
        """The positions and tenants of the waiting jobs in head rows (columns ``tenant`` 10th, ``arrival_pos`` last)."""
        for r in rows:  # (a job entered since the tick numbered the lane's, -1: not numbered, as the youngest)
            self._positions[r[0]] = None if r[-1] is None or r[-1] <= 0 else int(r[-1])
            self._tenants[r[0]] = r[10]

    def _read(self, job_id: str) -> None:
        found = self.cur.one(queries.OVERTAKE_POSITION, {"id": job_id})
        p, tenant = (None, DEFAULT_TENANT) if found is None else found
        self._positions[job_id] = None if p is None else int(p)
        self._tenants[job_id] = tenant

    def position(self, job_id: str) -> int | None:
        """The arrival position of waiting job ``job_id`` (None: not numbered, or not waiting)."""
        if job_id not in self._positions:
            self._read(job_id)
        return self._positions[job_id]

    def tenant(self, job_id: str) -> str:
        """The tenant of job ``job_id`` (its rooms are its tenant's)."""
        if job_id not in self._tenants:
            self._read(job_id)
        return self._tenants[job_id]

    def read(self, tenants: Iterable[str]) -> None:
        """Read the epoch rows of ``tenants`` not read yet, in one statement (a tick's head's tenants)."""
        wanted = sorted(set(tenants) - self._epochs.keys())
        if not wanted:
            return
        params: dict[str, object] = {"l": self.lane, **{f"t{i}": t for i, t in enumerate(wanted)}}
        found: dict[str, list[tuple[int, int, int | None]]] = {t: [] for t in wanted}
        for t, e, p, b in self.cur.all(queries.overtake_epochs(len(wanted)), params):
            found[t].append((int(e), int(p), None if b is None else int(b)))
        self._epochs.update((t, _TenantEpochs(rows)) for t, rows in found.items())

    def epochs(self, tenant: str) -> _TenantEpochs:
        """``tenant``'s epoch rows in the lane (read the first time a tick asks)."""
        if tenant not in self._epochs:
            self.read((tenant,))
        return self._epochs[tenant]

    def _epoch_rows(self, tenant: str, epoch: int) -> list[tuple[int, int]]:
        if (tenant, epoch) not in self._rows:
            sql = queries.OVERTAKE_EPOCH_ROWS_SQLITE if self.cur.dialect == "sqlite" else queries.OVERTAKE_EPOCH_ROWS
            found = self.cur.all(sql, {"l": self.lane, "t": tenant, "e": epoch})
            self._rows[tenant, epoch] = [(int(p), int(b)) for p, b in found]
        return self._rows[tenant, epoch]

    def _part(self, tenant: str, mine: _TenantEpochs, epoch: int, lo: int, hi: int) -> int:
        """The least room of ``tenant``'s waiting jobs of epoch ``epoch`` with ``lo <= position < hi``, row by row."""
        passed = mine.passed(epoch)
        if passed is None:
            return NONE
        return min((b - passed for p, b in self._epoch_rows(tenant, epoch) if lo <= p < hi), default=NONE)

    def least(self, lo: int, hi: int, tenant: str) -> int | None:
        """The least room of ``tenant``'s waiting numbered jobs with ``lo <= position < hi`` (None: none waits)."""
        if lo >= hi:
            return None
        mine = self.epochs(tenant)
        if not mine.rows:
            return None
        first, last = lo // EPOCH, (hi - 1) // EPOCH
        if first == last:  # one epoch, whole or in part
            whole = lo == first * EPOCH and hi == (first + 1) * EPOCH
            best = mine.whole(first, first + 1) if whole else self._part(tenant, mine, first, lo, hi)
        else:
            best = min(
                mine.whole(first, first + 1) if lo == first * EPOCH else self._part(tenant, mine, first, lo, hi),
                mine.whole(first + 1, last),
                mine.whole(last, last + 1) if hi == (last + 1) * EPOCH else self._part(tenant, mine, last, lo, hi),
            )
        return None if best >= NONE else best

    def oldest(self, *, k: int, burst: int, head: Sequence) -> list:
        """Head rows (:data:`queries.HEAD_SQL`'s columns) of the ``k`` oldest numbered waiting jobs not in ``head``
        of each tenant of ``head`` whose least room is short of ``burst`` (no other tenant's job is a candidate, and
        its rooms hold nobody else back). A job its tenant's rooms refuse may still pass these (the oldest passes
        nobody): without them a head full of held jobs would lease nothing. A gate's tick leases only the ones a
        waiter waits for; the others' rooms it does not let bind (``LaneSnapshot.exempt``)."""
        have = {r[0] for r in head}
        tenants = sorted({r[10] for r in head})
        self.read(tenants)
        out = []
        for tenant in tenants:
            if self.epochs(tenant).whole(0, NONE) < burst:
                rows = self.cur.all(queries.OVERTAKE_OLDEST, {"l": self.lane, "t": tenant, "k": k})
                out += [r for r in rows if r[0] not in have]
        return out

    def first_epoch(self, tenants: Iterable[str]) -> int | None:
        """The oldest epoch with a waiting numbered job of any of ``tenants`` (None: none waits)."""
        firsts = [e for t in set(tenants) if (e := self.epochs(t).first()) is not None]
        return min(firsts, default=None)


class _TenantEpochs:
    """One tenant's epoch rows ``(epoch, passed, least base or None)``, ascending, and their least rooms."""

    def __init__(self, rows: list[tuple[int, int, int | None]]) -> None:
        self.rows = rows
        self.numbers = [e for e, _, _ in rows]
        self.table = _MinTable([NONE if b is None else b - p for _, p, b in rows])

    def passed(self, epoch: int) -> int | None:
        """Epoch ``epoch``'s counter (None: no row, or no job waits in it)."""
        i = bisect_left(self.numbers, epoch)
        if i == len(self.numbers) or self.numbers[i] != epoch or self.rows[i][2] is None:
            return None
        return self.rows[i][1]

    def whole(self, first: int, end: int) -> int:
        """The least room over the epochs ``first <= epoch < end``, each whole: one range of the min table."""
        return self.table.least(bisect_left(self.numbers, first), bisect_left(self.numbers, end))

    def first(self) -> int | None:
        """The oldest epoch with a waiting job (None: none waits)."""
        return next((e for e, _, head in self.rows if head is not None), None)


def passed(
    cur: Cursor,
    lane: str,
    rooms: Rooms,
    admitted: Iterable[tuple[str, int]],
    exempt: Iterable[tuple[str, int]] = (),
) -> None:
    """Charge what this tick admitted, ``(job id, rate)`` each, to the waiting jobs older than it: two statements,
    the older epochs' counters and the older jobs of each one's own epoch; then give back to each job of
    ``exempt`` (``(job id, rate tokens)``, :meth:`lane_plugin.policy.perjob.ExactBudget.exempt_charges`) what passed
    it while it could not go this tick.

    Runs after the tick's leases are written (its jobs no longer wait), in the tick's transaction.
    """
    back = [{"id": job_id, "x": x} for job_id, x in exempt]
    if back:  # (a parked one has left the queue: its row is not waiting, nothing is written)
        cur.executemany(queries.OVERTAKE_GIVE_BACK, back)
    charges = []  # (its epoch, its position, its rate, its tenant); not numbered: as the youngest of its tenant
    for job_id, rate in admitted:
        p = rooms.position(job_id)
        charges.append(((1 << 62) if p is None else p // EPOCH, p, rate, rooms.tenant(job_id)))
    first = rooms.first_epoch(c[3] for c in charges)
    if first is None:
        return  # no numbered job of theirs waits: nobody was passed
    params: dict[str, object] = {"l": lane, "lo": first, "top": max(c[0] for c in charges)}
    for i, (epoch, _, rate, tenant) in enumerate(charges):
        params[f"o{i}"], params[f"r{i}"], params[f"t{i}"] = epoch, rate, tenant
    cur.execute(queries.overtake_pass_epochs(len(charges)), params)
    numbered = [c for c in charges if c[1] is not None]
    if numbered:
        params = {"l": lane, "pmax": max(c[1] for c in numbered)}
        for i, (epoch, p, rate, tenant) in enumerate(numbered):
            params[f"o{i}"], params[f"p{i}"], params[f"r{i}"], params[f"t{i}"] = epoch, p, rate, tenant
        cur.execute(queries.overtake_pass_own_epochs(len(numbered), cur.dialect), params)


def restart(cur: Cursor, lane: str) -> None:
    """The lane's slack changed (or the rule was turned on or off): forget every waiting job's number and room.

    Rooms counted under another slack, or not counted while the rule was off, would be wrong for this one; with
    the rule on, the waiting jobs are numbered afresh by the next tick, in the order they entered.
    """
    cur.execute(queries.OVERTAKE_FORGET_JOBS, {"l": lane})
    cur.execute(queries.OVERTAKE_FORGET_EPOCHS, {"l": lane})


def refit(cur: Cursor, lane: str, now: float, since: float | None, was: int | None = None) -> int | None:
    """Learn ``Q``, the p99 of the rate tokens waiting at the lane's arrivals of the last day, drop the epochs
    nobody waits in, and mark for numbering a waiting job an intake wrote unnumbered as the rule was being turned on
    (it read the lane just before: PostgreSQL intake takes no lane lock). Returns the ``Q`` written (None: the rule
    has not been on for a day since ``since``, or fewer than the warm-up's arrivals: left as it was).

    ``since`` None with the rule on (a row written by hand, or by a migration: a migration's host clock is not the
    ledger's): its learning day starts now, by the ledger's clock, rather than binding at once.

    The first ``Q`` learned (``was`` None: the learning day ends) numbers the waiting jobs afresh (:func:`restart`):
    numbered on the learning day their keys are :data:`UNBOUNDED`, and kept so the jobs waiting across the end of
    the day (the deepest backlog) would never be held. A later refit's ``Q`` reads only in the keys of new arrivals.
    """
    cur.execute(queries.OVERTAKE_SWEEP, {"l": lane})
    sql = queries.OVERTAKE_DROP_EMPTY_EPOCHS_SQLITE if cur.dialect == "sqlite" else queries.OVERTAKE_DROP_EMPTY_EPOCHS
    cur.execute(sql, {"l": lane})
    if since is None:
        cur.execute(queries.OVERTAKE_START_DAY, {"l": lane, "t": now})
        return None
    if now - since < LEARN_SECONDS:
        return None
    since = now - LEARN_SECONDS
    n = int(cur.scalar(queries.OVERTAKE_ARRIVALS_SINCE, {"l": lane, "since": since}))
    if n < QUANTILE_WARMUP:
        return None
    k = min(n - 1, int(SLACK_QUANTILE * n))
    q = int(cur.scalar(queries.OVERTAKE_ARRIVAL_V_AT, {"l": lane, "since": since, "k": k}))
    cur.execute(queries.OVERTAKE_SET_Q, {"l": lane, "q": q})
    if was is None:
        restart(cur, lane)
    return q


class _MinTable:
    """The least of any range of a fixed list in one step (a sparse table: ``log2(n)`` rows, built once a tick).

    Example:
        >>> t = _MinTable([5, 3, 8, 1, 9])
        >>> t.least(0, 3), t.least(2, 5), t.least(4, 5), t.least(3, 3)
        (3, 1, 9, 4611686018427387904)
    """

    def __init__(self, values: Sequence[int]) -> None:
        self.rows = [list(values)]
        span = 1
        while 2 * span <= len(values):
            prev = self.rows[-1]
            self.rows.append([min(prev[i], prev[i + span]) for i in range(len(prev) - span)])
            span *= 2

    def least(self, lo: int, hi: int) -> int:
        """The least of ``values[lo:hi]`` (:data:`NONE` when empty)."""
        if lo >= hi:
            return NONE
        k = (hi - lo).bit_length() - 1
        return min(self.rows[k][lo], self.rows[k][hi - (1 << k)])
