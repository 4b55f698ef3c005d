"""A waiting job as admission sees it (:class:`Candidate`) and its kind: finishing, starting or free.

A *finishing* job's run already has an admitted job in the lane, a *starting* job's run has
none, a *free* job has no run. The kind decides which rules apply to it
(:mod:`lane_plugin.policy.admission`): a starting or free job leaves the finishing reserve of
every run under way, a finishing job may use it.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from .limits import units_of

# Kinds of job. Stable strings: the CLI prints them and tests compare them.
FINISH, START, FREE = "finishing", "starting", "free"


@dataclass(frozen=True)
class Candidate:
    """A waiting job at the head of the queue.

    ``after`` is what its run is expected to still need once it is admitted
    (:func:`lane_plugin.policy.reserve.fit_runs`); ``prio`` its stored place in the
    order (computed by :func:`lane_plugin.policy.order.priority` when None); ``var``
    the variance of its ``actual - est`` (``job.est_var``: its estimator's spread; 0 unknown);
    ``tenant`` who it belongs to inside its lane (:mod:`lane_plugin.policy.fairness`).
    ``input_cost`` and ``output_cost`` its input tokens and output allowance for the limits over
    ``input_tokens`` and ``output_tokens`` (None: unknown, its whole rate cost counts against each).

    Example:
        >>> Candidate("j1", est=300, waiting_since=0.0).rate, Candidate("j2", 300, 0.0, rate_cost=800).rate
        (300, 800)
    """

    id: str
    est: int
    waiting_since: float
    run_key: str | None = None
    rate_cost: int | None = None
    stage: str | None = None
    after: int = 0
    prio: float | None = None
    var: int = 0
    tenant: str = "default"
    input_cost: int | None = None
    output_cost: int | None = None

    @property
    def rate(self) -> int:
        """What the job charges the provider's rate limiter: ``rate_cost``, else its estimate."""
        return self.est if self.rate_cost is None else self.rate_cost

    @property
    def units(self) -> dict[str, int]:
        """What the job counts against each limit unit (:func:`lane_plugin.policy.limits.units_of`)."""
        return units_of(self.rate, self.input_cost, self.output_cost)


def kind_of(c: Candidate, started: Container[str]) -> str:
    """:data:`FINISH`, :data:`START` or :data:`FREE`: whether ``c``'s run is among the ``started`` ones.

    Example:
        >>> kind_of(Candidate("a", 1, 0.0, run_key="r"), {"r"}), kind_of(Candidate("b", 1, 0.0), {"r"})
        ('finishing', 'free')
    """
    if c.run_key is None:
        return FREE
    return FINISH if c.run_key in started else START
