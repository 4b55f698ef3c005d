"""The order of the waiting queue (admission rule 7): one continuous priority, and the wait bound it gives.

Ascending ``prio = wait_since + est * age_factor`` with ``age_factor = max_wait_seconds /
min(ceiling, burst_tokens)`` seconds per token (:attr:`LanePolicy.age_factor`); equivalently
``key = est + k * wait_since`` with ``k = 1 / age_factor`` tokens per second: small jobs first,
each second of waiting worth ``k`` tokens of size. Once the lane has learned a size-class
boundary (:func:`lane_plugin.policy.sizeclass.size_class_boundary`), two classes for the jobs
that are not finishing at intake: ``wait_since`` at or under it, ``+ max_wait_seconds`` above.

The wait bound. Let J wait since ``w`` with estimate ``e <= min(ceiling, burst_tokens)``:
``prio <= w + max_wait_seconds`` either way, and a job arriving at ``t`` has ``prio >= t``, so
*no job arriving after J's prio* (after ``w + (e - 1) * age_factor`` while the lane has no
boundary) *is ever ahead of J*, whatever boundary each job was placed by: that is within
``max_wait_seconds``. The jobs ahead of J are a finite set, each admitted or parked in turn.
Once J is the head past that horizon, its shadow keeps what is admitted after it out of its room
(rule 8, :mod:`lane_plugin.policy.admission`), so J is admitted (or parked, if spend leaves it no
room) within ``max(time for the work leased before it to settle, window_seconds)``. The one
exception is rule 8's: stages of runs under way may pass a starting or free head; no new run
starts past it, so this is bounded by the runs under way when J became the head.
tests/policy check the bound on random traffic (hypothesis).

**The deadline rule: a p99 bound against token-fifo, by construction.** The bound above is
``max_wait_seconds`` plus a drain, whatever token-fifo would have done: on traffic whose FIFO waits are
short beside ``max_wait_seconds`` a big job (held ``max_wait_seconds`` by its size class) or the job of a
heavily served tenant (held by the fair merge) waits several times its FIFO wait. A candidate may
carry a deadline (``due_at``, :func:`due_at`): ``due_at = w + beta * V(w) / mu`` with ``w`` its
``wait_since``, ``V(w)`` the rate tokens waiting in the lane when it arrived (itself excluded), ``mu =
burst_tokens / window_seconds`` the lane's rate and ``beta`` :data:`OVERDUE_BETA`. ``F = V(w) / mu`` is
the wait token-fifo gives the same job on the same arrivals: in a lane that serves ``mu`` tokens a
second while anything waits (rate-bound, work-conserving), the tokens waiting at any instant are the
same under every work-conserving order, and FIFO serves exactly them before J. The rule (:func:`order`):
the *overdue* candidates (``due_at <= now``) come first, by ``(due_at, id)``, ahead of the size and
fair order; the others follow in that order.

*Claim.* Let ``mu' = (burst_tokens - R) / window_seconds`` with ``R`` the largest rate cost (what the
sliding window admits per second at least while a head waits for room: it holds at most ``R`` back), and
``A`` the rate tokens of the jobs that arrive after J with a deadline no later than J's. Then
``wait(J) <= beta F + (V(w) + A) / mu' + 2 window_seconds``. *Proof.* From ``due_at`` on, J is overdue and
only overdue jobs with an earlier deadline (ties by id) go before it: those that arrived before J, whose
tokens are among the ``V(w)`` waiting when J arrived, and the ``A`` tokens. Nothing else is admitted
before J (it is overdue and they are not, or later), and the jobs ahead of it, the head holding its
shadow (rule 8), pass the window at ``mu'`` at least: one window for where the window stood at
``due_at``, one for the last head's room. *A is small:* between ``w`` and ``w' > w`` the window admits
at most ``mu (w' - w) + burst_tokens``, so ``V(w') >= V(w) - mu (w' - w) - burst_tokens`` and
``due(w') >= due(w) + (1 - beta)(w' - w) - beta window_seconds``: only jobs arriving within
``beta window_seconds / (1 - beta)`` after J can be counted in ``A`` (none if deadlines follow arrival).
So every wait is within ``1 + beta`` of token-fifo's plus a window or two of tokens, and every quantile
with it: ``p99 <~ (1 + beta) p99_fifo``. tests/policy/test_deadlines.py checks the inequality for every
job on random traffic with tenants (hypothesis).

The rule is not fair: while jobs are overdue the lane is FIFO among them. The fairness bound
(:mod:`lane_plugin.policy.fairness`) holds among tenants over any span in which no candidate is overdue;
overdue admissions still charge their tenant's counter. And it costs the size order its gains when
``beta`` is small: a pointwise bound of ``1 + beta`` lets a small job pass at most about ``beta`` of its
FIFO wait's worth of tokens, and on a lane that stays backlogged every job soon becomes overdue, so the
order turns first come, first served (docs/admission.md, "Deadlines", with the figures). The ledger gives
its jobs no deadline yet (``due_at`` None: the rule is off, today's order).
"""

from __future__ import annotations

from collections.abc import Iterable

from .candidate import Candidate
from .fairness import fair_order
from .lane import LanePolicy, LaneSnapshot

# The deadline's slack over token-fifo's wait (:func:`due_at`): waits stay within ``1 + OVERDUE_BETA``
# of FIFO's plus one window.
OVERDUE_BETA = 0.25


def due_at(policy: LanePolicy, wait_since: float, waiting_rate: int, beta: float = OVERDUE_BETA) -> float:
    """A job's deadline: ``wait_since + beta * waiting_rate / mu``, ``mu = burst_tokens / window_seconds``.

    ``waiting_rate``: the rate tokens waiting in the lane when the job arrived (not its own), so
    ``waiting_rate / mu`` is the wait token-fifo gives it.

    Example:
        >>> due_at(LanePolicy(ceiling=10**9, burst_tokens=600_000, window_seconds=60.0), 100.0, 4_000_000)
        200.0
    """
    return wait_since + beta * waiting_rate * policy.window_seconds / policy.burst_tokens


def priority(
    policy: LanePolicy,
    est: int,
    wait_since: float,
    size_class_boundary: int | None = None,
    finishing: bool = False,
) -> float:
    """A waiting job's place in the order, lower first.

    ``size_class_boundary`` None, or a job ``finishing`` a run under way at intake (holding a
    run's later stage back strands what the run spent): one continuous priority,
    ``est * age_factor`` added; else two classes.

    Example:
        >>> p = LanePolicy(ceiling=10_000, burst_tokens=1_000, max_wait_seconds=600)
        >>> priority(p, 500, 100.0), priority(p, 100, 300.0), priority(p, 500, 100.0, 400, finishing=True)
        (400.0, 360.0, 400.0)
        >>> priority(p, 500, 100.0, 400), priority(p, 400, 300.0, 400)   # above / at the boundary
        (700.0, 300.0)
    """
    if size_class_boundary is None or finishing:
        return wait_since + est * policy.age_factor
    return wait_since + (policy.max_wait_seconds if est > size_class_boundary else 0.0)


def order(snapshot: LaneSnapshot, candidates: Iterable[Candidate]) -> list[Candidate]:
    """Admission order: ascending priority (a candidate's stored ``prio``, else :func:`priority`), ties by id.

    Candidates of several tenants: each tenant's in that order, the tenants merged fairly by tokens
    (:func:`lane_plugin.policy.fairness.fair_order`). The *overdue* candidates (``due_at <= now``) come
    first, by ``(due_at, id)`` (the deadline rule above); a candidate given twice counts once.

    Example:
        >>> s = LaneSnapshot(LanePolicy(ceiling=1_000, burst_tokens=500), 0, 0, 0, 0, now=0.0)
        >>> [c.id for c in order(s, [Candidate("big", 400, 0.0), Candidate("small", 10, 5.0)])]
        ['small', 'big']
        >>> s = LaneSnapshot(LanePolicy(ceiling=1_000, burst_tokens=500), 0, 0, 0, 0, now=6.0)
        >>> small = Candidate("small", 10, 5.0)
        >>> [[c.id for c in order(s, [Candidate("big", 400, 0.0, due_at=d), small])] for d in (4.0, 9.0)]
        [['big', 'small'], ['small', 'big']]
    """
    p = snapshot.policy
    now = snapshot.now
    seen: dict[str, Candidate] = {}
    overdue: list[Candidate] = []
    for c in candidates:
        if c.id in seen:
            continue
        seen[c.id] = c
        if c.due_at is not None and c.due_at <= now:
            overdue.append(c)
    if overdue:
        overdue.sort(key=lambda c: (c.due_at, c.id))
        late = {c.id for c in overdue}
        rest = [c for c in seen.values() if c.id not in late]
    else:
        rest = list(seen.values())

    def key(c: Candidate) -> tuple[float, str]:
        return (priority(p, c.est, c.waiting_since) if c.prio is None else c.prio, c.id)

    return overdue + fair_order(snapshot.tenants, rest, key, now) if overdue else fair_order(snapshot.tenants, rest, key, now)
