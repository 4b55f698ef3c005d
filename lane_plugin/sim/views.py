"""What the simulation shows its policies (:mod:`lane_plugin.sim.policies`): job ids, units, candidates,
and whether the worker is asleep; a mixin of :class:`lane_plugin.sim.engine.Sim`."""

from __future__ import annotations

from ..policy import Candidate
from .limits import job_units


class PolicyView:
    """The views of :class:`lane_plugin.sim.engine.Sim` its policies read."""

    def job_id(self, j: int) -> str:
        """Stable id that sorts like the index (the policy breaks ties on id)."""
        return f"j{j:0{self._width}d}"

    def units(self, j: int) -> dict[str, int]:
        """What job ``j`` counts against each limit unit at admission (:func:`lane_plugin.sim.limits.job_units`)."""
        return job_units(self.rate[j], self.est[j], self.trace.input_tokens[j])

    def index_of(self, c: Candidate) -> int:
        return int(c.id[1:])

    def candidate(self, j: int) -> Candidate:
        """The ``lane`` policy's candidate for job ``j`` (cached until the reserve profile is refit)."""
        return self.lane_queue.candidate(j)

    def asleep(self, t: float) -> bool:
        """Whether the cold drainer is asleep at ``t`` (the last part of each cycle)."""
        cfg = self.cfg
        return bool(cfg.sleep_seconds) and (t % cfg.sleep_every) >= cfg.sleep_every - cfg.sleep_seconds

    def stopped(self, t: float) -> bool:
        """The lane is stopped when its preflight ping fails: the worker is asleep."""
        return self.cfg.preflight and self.asleep(t)
