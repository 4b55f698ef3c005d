"""The overtaking budget (admission rule 12): every wait bounded against token-fifo's, by construction.

The order of rule 7 (small jobs first, the size classes, the fair merge of tenants) lets a job be passed
by later, smaller or better-placed jobs for up to ``max_wait_seconds``, whatever first come, first served
would have done. This rule bounds it relative to token-fifo, in tokens, whatever the traffic.

**The rule.** A job J that enters the queue when ``V_J`` rate tokens wait there (J excluded) gets the key
(:func:`overtake_key`) ``key_J = floor(beta V_J)``, :data:`OVERTAKE_BETA` ``= beta``: how many rate tokens
of younger jobs may be admitted ahead of it. *Older* is the order jobs entered the queue (the ledger:
``(wait_since, id)``; a job whose lease expired enters again, as a new arrival). The lane keeps two
counters, the rate tokens waiting (``V``) and the rate tokens that ever left the queue (leased or parked,
``left``), and each job its position ``pos_J = left + V`` at its arrival. Then ``passed = left - pos_J0``,
``J0`` the oldest job waiting, is what left the queue since J0 arrived less the ``V_J0`` tokens that
waited ahead of it (all gone: J0 is the oldest), so at least the rate tokens of younger jobs admitted
ahead of J0. An admission of a job X that is not the oldest waiting (*out of order*) is allowed only if
``passed`` plus what this tick already admitted out of order plus ``rate(X)`` is at most the least key of
the jobs waiting but X (the head of an index). The oldest waiting job is always allowed (it passes
nobody). Nothing else changes: the candidates are read in rule 7's order, a job the budget keeps out is
skipped (it holds no shadow: rule 8's head is the first job the budget allows that does not fit), and once
``passed`` reaches the least key the oldest jobs come first, in arrival order.

**The bound** (*token time*). Let ``O_J`` be the rate tokens of jobs younger than J admitted since J
arrived. Every job younger than J is younger than J0, and J0 has waited since before J arrived, so
``O_J <= O_J0 <= passed``. An out-of-order admission is allowed only while ``passed`` (with it) stays at
most every waiting job's key, an in-order one passes nobody and a new arrival starts at ``O = 0``: so
``O_J <= key_J`` for every job, always. The jobs admitted between J's arrival and its admission are older
than J (among the ``V_J`` waiting when it arrived) or younger (``O_J``). **So at most** ``V_J + floor(beta
V_J)`` **rate tokens are ever admitted ahead of J, where token-fifo admits exactly** ``V_J`` **(less any
parked): within** ``1 + beta`` **of token-fifo's, for every job, on any traffic, with any tenants and
weights.** It holds whatever else keeps jobs out (ceiling, lease slots, limits): it counts tokens, not
seconds. Liveness: while ``passed`` is at least the least key only the oldest may go; each such admission
makes the next oldest the oldest, whose ``passed`` is no larger, until the job holding the least key is
the oldest and goes in turn.

*In seconds.* On a lane bound by its rate (``mu = burst_tokens / window_seconds`` tokens a second while
anything waits) token-fifo's wait is ``F = V / mu`` and the window passes at least ``mu' = (burst_tokens -
R) / window_seconds`` while a head waits for room (``R`` the largest rate cost: rule 8's shadow holds at most
that back), so ``wait(J) <= (1 + beta) V / mu' + 2 window_seconds`` (one window for where the window stood
when J arrived, one for the last head's room): every quantile with it,
``p99 <= (1 + beta) (mu / mu') p99_fifo`` plus two windows. With ``beta = 0.25`` and a largest rate cost
of at most 4% of the burst that is ``1.3`` x token-fifo's p99, on any traffic.

*Jobs held by something else.* A job kept out by its tenant's budget, or that spend (or a limit) keeps
out until the next reset, is counted around when admission reads it (:meth:`Overtaking.left`, as a parked
job): with no room left the oldest come first, so such a job at the front is skipped and the next oldest
goes in order, rather than the lane waiting for the reset behind it (token-fifo would). The bound holds
for the jobs the order holds; a job held by its own budget or by spend may be passed while so.

**What it costs the order.** A pointwise bound is expensive: a backlogged lane can admit out of order at
most about ``beta / (1 + beta)`` of its tokens over the life of a job (20% at 0.25), and a job that arrived
at a short queue holds everyone to its small key. Measured (docs/admission.md, "Bounding waits against
first come, first served"): at ``beta = 0.25`` the p99 stays within 1.11x but the p50 gain is mostly lost
(Azure code trace 0.90x token-fifo's p50, Mooncake 0.54x); even charging each job exactly its own passes
(a per-job count, which no index head gives) leaves 0.93x and 0.53x. The jobs whose p50 the size order
buys are a third of the rate tokens on the Azure trace, more than a ``1 + beta`` bound lets them pass. So
this form is an exploration of the simulator (``SimConfig.overtake_beta``); the ledger runs the quantile form
(:mod:`lane_plugin.policy.slack`), an option of each lane.

**With tenants.** The fair merge orders the candidates; the budget applies to every admission, whatever
its tenant. The service-gap bound (:mod:`lane_plugin.policy.fairness`) holds over any span in which the
budget does not bind (no job skipped); while it binds the lane serves its oldest jobs first, whatever
their tenant (their admissions still charge their tenant's counter, so a tenant served out of turn pays
it back afterwards), and every wait stays within ``1 + beta`` of token-fifo's.

tests/policy/test_overtake.py checks the token bound for every job on random traffic with tenants
(hypothesis).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .candidate import Candidate
from .perjob import ExactBudget, Rooms

# The overtaking budget's slack over token-fifo (rule 12): at most ``(1 + OVERTAKE_BETA) V`` rate tokens are
# admitted ahead of a job that found ``V`` waiting. 0.25: within 1.3x in seconds with rate costs up to 4% of
# the burst (the module's bound), a margin of the bound, not of any trace.
OVERTAKE_BETA = 0.25


def overtake_key(waiting_rate: int, beta: float = OVERTAKE_BETA) -> int:
    """A job's overtaking key at its arrival: ``floor(beta * waiting_rate)``.

    ``waiting_rate``: the rate tokens waiting in the lane then (not its own). An integer, so the ledger
    stores and indexes it exactly.

    Example:
        >>> overtake_key(40_000), overtake_key(0), overtake_key(3, 0.5)
        (10000, 0, 1)
    """
    if waiting_rate < 0:
        raise ValueError(f"waiting_rate={waiting_rate!r} must be >= 0")
    return int(beta * waiting_rate)


class Overtaking:
    """The budget inside one admission tick: which candidates it allows, and what they add to the counter.

    ``passed``: the rate tokens of younger jobs that left the queue since the oldest waiting job arrived
    (the module's ``left - pos_J0``); ``guard``: the least keys of the waiting jobs, ``(key, id)`` ascending
    (the first few: the keys past them are no smaller than the last one read); ``oldest``: the ids of the
    waiting jobs in arrival order (the first few). An empty ``guard``: the rule is off (everything allowed).
    ``since`` and ``dues`` (optional, :mod:`lane_plugin.policy.slack`'s second bound): the rate tokens that ever
    left the queue, and the least ``due = left at arrival + key`` of the waiting jobs, ``(due, id)`` ascending;
    a pass is also allowed while ``since`` plus what this tick admitted plus its rate is at most the least due.
    ``guard_dues`` (optional, with ``dues``): the due of each entry of ``guard``, in its order; then a pass is allowed
    while each waiting job is within *either* of its own two allowances (its key against ``passed``, its due against
    ``since``), read down the key index: the per-job form of the two heads (docs/admission.md).
    ``rooms`` (optional, :mod:`lane_plugin.policy.perjob`, what the ledger runs): each waiting job's own room instead of
    the heads; then a pass is allowed while every older waiting job has room for it.

    Example:
        >>> o = Overtaking(0, ((500, "old"), (9_000, "small")), ("old", "small"))
        >>> o.allows(Candidate("small", 400, 5.0)), o.allows(Candidate("big", 600, 5.0))
        (True, False)
        >>> o.admitted(Candidate("small", 400, 5.0)); o.overtook, o.allows(Candidate("mid", 200, 5.0))
        (400, False)
        >>> o.allows(Candidate("old", 9_000, 0.0))   # the oldest passes nobody
        True
    """

    __slots__ = (
        "_done",
        "_i",
        "base",
        "dues",
        "exact",
        "guard",
        "guard_dues",
        "moved",
        "oldest",
        "on",
        "overtook",
        "since",
    )

    def __init__(
        self,
        passed: int,
        guard: Sequence[tuple[int, str]],
        oldest: Sequence[str],
        since: int = 0,
        dues: Sequence[tuple[int, str]] = (),
        rooms: Rooms | None = None,
        guard_dues: Sequence[int] = (),
        exempt: Iterable[str] = (),
    ) -> None:
        self.base, self.guard, self.oldest, self.since, self.dues = passed, guard, oldest, since, dues
        self.guard_dues = guard_dues
        self.exact = None if rooms is None else ExactBudget(rooms, exempt)
        self.on = bool(guard) or self.exact is not None
        self.overtook = 0  # the rate tokens this tick admits out of order
        self.moved = 0  # the rate tokens this tick admits, in order or not
        self._i = 0  # oldest[_i]: the oldest job still waiting (as far as the list reaches)
        self._done: set[str] = set()

    def in_order(self, c: Candidate) -> bool:
        """Whether ``c`` is the oldest waiting job (a job past the list read counts as out of order)."""
        return self._i < len(self.oldest) and self.oldest[self._i] == c.id

    def limit(self, cid: str, heads: Sequence[tuple[int, str]] | None = None) -> int:
        """The least key (of ``heads``: due) of the jobs still waiting but ``cid`` (a lower bound past those read)."""
        done = self._done
        heads = self.guard if heads is None else heads
        for key, jid in heads:
            if jid != cid and jid not in done:
                return key
        return heads[-1][0]

    def allows(self, c: Candidate) -> bool:
        """Whether the budget lets ``c`` be admitted now."""
        if self.exact is not None:
            return self.exact.allows(c)
        if not self.on or self.in_order(c):
            return True
        if self.guard_dues:
            return self._either(c)
        if self.base + self.overtook + c.rate <= self.limit(c.id):
            return True
        return bool(self.dues) and self.since + self.moved + c.rate <= self.limit(c.id, self.dues)

    def _either(self, c: Candidate) -> bool:
        """Whether every waiting job but ``c`` keeps ``O <= key`` by its key (against ``passed``) or by its due
        (against ``since``) after ``c`` passes it: down the key index while keys are short of the first test, each
        job there must pass the second; past the rows read, the least due must."""
        need_key = self.base + self.overtook + c.rate
        need_due = self.since + self.moved + c.rate
        done = self._done
        for (key, jid), due in zip(self.guard, self.guard_dues):
            if jid == c.id or jid in done:
                continue
            if key >= need_key:  # this job and every one after it in the index pass by their keys
                return True
            if due < need_due:
                return False
        if self.guard[-1][0] >= need_key:
            return True
        return bool(self.dues) and self.limit(c.id, self.dues) >= need_due

    def spent(self) -> bool:
        """Whether the budget has no room left for any pass (then the lane is first come, first served)."""
        if self.exact is not None or self.guard_dues:  # per job: a pass may have room, the candidates keep their order
            return False
        return self.base >= self.guard[0][0] and (not self.dues or self.since >= self.dues[0][0])

    def oldest_first(self, candidates: Iterable[Candidate]) -> list[Candidate]:
        """``candidates`` with the oldest waiting jobs first, in arrival order (they are admitted in order,
        each passing nobody); the rest after them in their order."""
        rest = list(candidates)
        by_id = {c.id: c for c in rest}
        front = [by_id[i] for i in self.oldest if i in by_id]
        first = {c.id for c in front}
        return front + [c for c in rest if c.id not in first]

    def admitted(self, c: Candidate) -> None:
        """``c`` is admitted: out of order, its rate tokens count."""
        if self.exact is not None:
            self.exact.admitted(c)
            self.overtook, self.moved = self.exact.overtook, self.moved + c.rate
            return
        if self.on and not self.in_order(c):
            self.overtook += c.rate
        self.moved += c.rate
        self.left(c)

    def uncounted(self, c: Candidate) -> None:
        """``c``, a stage of a run under way, is admitted: its key no longer binds, and it charges nobody."""
        if self.exact is not None:
            self.exact.uncounted(c)
        else:
            self.left(c)

    def left(self, c: Candidate) -> None:
        """``c`` stops waiting (admitted or parked): its key no longer binds."""
        if self.exact is not None:
            self.exact.left(c)
            return
        if not self.on:
            return
        self._done.add(c.id)
        oldest, done = self.oldest, self._done
        while self._i < len(oldest) and oldest[self._i] in done:
            self._i += 1
