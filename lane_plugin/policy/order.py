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

**Against token-fifo.** The bound above is ``max_wait_seconds`` plus a drain, whatever first come, first
served would have done: on traffic whose FIFO waits are short beside ``max_wait_seconds`` a big job (held
by its size class) or the job of a heavily served tenant (held by the fair merge) could wait several times
its FIFO wait. Rule 12, the overtaking budget (:mod:`lane_plugin.policy.overtake`), bounds every wait
within ``1 + beta`` of token-fifo's, in tokens, by construction; this order decides who goes within it.
"""

from __future__ import annotations

from collections.abc import Iterable

from .candidate import Candidate
from .fairness import fair_order
from .lane import LanePolicy, LaneSnapshot


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
    (:func:`lane_plugin.policy.fairness.fair_order`). A candidate given twice counts once.

    Example:
        >>> s = LaneSnapshot(LanePolicy(ceiling=1_000, burst_tokens=500), 0, 0, 0, 0, now=0.0)
        >>> [c.id for c in order(s, [Candidate("big", 400, 0.0), Candidate("small", 10, 5.0)])]
        ['small', 'big']
    """
    p = snapshot.policy
    now = snapshot.now
    seen: dict[str, Candidate] = {}
    for c in candidates:
        if c.id not in seen:
            seen[c.id] = c

    def key(c: Candidate) -> tuple[float, str]:
        return (priority(p, c.est, c.waiting_since) if c.prio is None else c.prio, c.id)

    return fair_order(snapshot.tenants, list(seen.values()), key, now)
