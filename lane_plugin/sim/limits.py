"""A simulated lane's limits as its provider states them (rule 6b), and which one held the queue back.

The lane's ``tokens`` limit is the burst window the engine already keeps (``Sim.window``); the
others (``requests``, ``input_tokens``, ``output_tokens``, :data:`lane_plugin.policy.limits.EXTRA_UNITS`)
each get a sliding :class:`~lane_plugin.sim.window.RateWindow`, counted as the ledger counts them:

- ``requests``: 1 per admission;
- ``input_tokens``: the job's input tokens where the trace knows them, else its whole rate cost;
- ``output_tokens``: the job's output allowance at admission (its estimate less its input), counted
  again from the settlement as the output the trace records (a provider counts output as generated).
  A job whose split is unknown counts its whole rate cost against both
  (:func:`lane_plugin.policy.limits.units_of`).

Every policy obeys them: ``lane`` hands them to :func:`lane_plugin.policy.admit` as the snapshot's
:class:`~lane_plugin.policy.limits.LimitUse` windows, the baselines check them as they check the burst.
What each limit did is measured two ways: ``held`` (seconds during which that limit was what kept the
head of the queue waiting, ``tokens`` included: the *binding* limit is the one with the most) and
``over`` (units admitted past the amount in any sliding window, as a provider would have refused them:
0 for every policy that obeys them; for ``output_tokens``, the output of the requests that arrived while
the provider's window of generated output was full, :class:`lane_plugin.sim.meter.OverGenerated`).

Example:
    >>> from lane_plugin.policy.limits import Limit
    >>> lim = SimLimits((("requests", Limit(2, 10.0)),))
    >>> for t in (0.0, 1.0):
    ...     lim.charge(t, 0, {"requests": 1})
    >>> lim.blocking(2.0, {"requests": 1}), lim.free_at(2.0, "requests", 1)
    ('requests', 10.0)
"""

from __future__ import annotations

from collections.abc import Mapping

from ..policy.limits import OUTPUT_TOKENS, TOKENS, Limit, LimitUse, units_of
from .meter import OverBurst, OverGenerated
from .window import Charge, RateWindow


class SimLimits:
    """The windows of a lane's limits other than ``tokens``, the time each limit held the queue, and overruns."""

    def __init__(self, limits: tuple[tuple[str, Limit], ...]) -> None:
        self.limits = limits
        self.windows = {unit: RateWindow(lim.window_seconds) for unit, lim in limits}
        self.meters = {unit: OverBurst(lim.amount, lim.window_seconds) for unit, lim in limits if unit != OUTPUT_TOKENS}
        self.generated = {
            unit: OverGenerated(lim.amount, lim.window_seconds) for unit, lim in limits if unit == OUTPUT_TOKENS
        }
        self._outputs: dict[int, tuple[Charge | None, int]] = {}  # output_tokens charges, counted again at settlement
        self.held: dict[str, float] = {}
        self._holder: str | None = None
        self._since = 0.0
        self.wake: float | None = None  # when a window a job was kept out by has room for it (set by the policies)

    def __bool__(self) -> bool:
        return bool(self.limits)

    def uses(self, now: float) -> tuple[LimitUse, ...]:
        """What each window holds at ``now``, as :class:`lane_plugin.policy.LaneSnapshot` carries it."""
        return tuple(LimitUse(unit, lim, self.windows[unit].used(now)) for unit, lim in self.limits)

    def blocking(self, now: float, units: Mapping[str, int], added: Mapping[str, int] | None = None) -> str | None:
        """The first limit ``units`` would overfill at ``now`` (``added``: units admitted this tick), or None."""
        for unit, lim in self.limits:
            extra = added.get(unit, 0) if added else 0
            if self.windows[unit].used(now) + extra + units.get(unit, 0) > lim.amount:
                return unit
        return None

    def free_at(self, now: float, unit: str, need: int) -> float | None:
        """Earliest time ``>= now`` at which ``unit``'s window has room for ``need`` units (None: never)."""
        amount = dict(self.limits)[unit].amount
        return self.windows[unit].free_at(now, amount - need)

    def kept_out(self, now: float, unit: str, need: int) -> None:
        """A job of ``need`` units was kept out by ``unit``'s limit: the engine ticks again when it has room."""
        at = self.free_at(now, unit, need)
        if at is not None and at > now and (self.wake is None or at < self.wake):
            self.wake = at

    def charge(self, now: float, j: int, units: Mapping[str, int]) -> None:
        """Job ``j`` admitted at ``now``: its units enter every window (and the overrun meters)."""
        for unit, window in self.windows.items():
            n = units[unit]
            c = window.charge(now, n)
            if unit == OUTPUT_TOKENS:
                self._outputs[j] = (c, n)
                self.generated[unit].request(now, j)
            else:
                self.meters[unit].charge(now, n)

    def settle(self, j: int, output: int | None, now: float) -> None:
        """Job ``j`` settled at ``now``: its ``output_tokens`` charge becomes what it generated (its allowance
        where the trace does not say), counted from now, as the ledger counts it and the provider sees it."""
        got = self._outputs.pop(j, None)
        if got is None:
            return
        c, allowance = got
        n = allowance if output is None else output
        self.windows[OUTPUT_TOKENS].redate(c, now, n)
        self.generated[OUTPUT_TOKENS].generated(now, j, n)

    def hold(self, now: float, unit: str | None) -> None:
        """From ``now`` until the next call, ``unit``'s limit (None: no limit) keeps the head of the queue waiting."""
        if self._holder is not None and now > self._since:
            self.held[self._holder] = self.held.get(self._holder, 0.0) + now - self._since
        self._holder, self._since = unit, now

    def over(self) -> dict[str, int]:
        """Units admitted past each limit in a sliding window (what the provider would have refused)."""
        return {unit: m.over for unit, m in (*self.meters.items(), *self.generated.items())}


def job_units(rate: int, est: int, input_tokens: int | None) -> dict[str, int]:
    """What one job counts against each unit at admission: its input, and its estimate less it as the output allowance.

    Example:
        >>> job_units(1_300, 900, 600)
        {'requests': 1, 'tokens': 1300, 'input_tokens': 600, 'output_tokens': 300}
    """
    output = None if input_tokens is None else max(0, est - input_tokens)
    return units_of(rate, input_tokens, output)


def bound_by(held: Mapping[str, float]) -> str | None:
    """The binding limit: the one that kept the queue waiting longest (None: no limit ever did).

    Example:
        >>> bound_by({"tokens": 3.0, "requests": 40.5}), bound_by({})
        ('requests', None)
    """
    return max(held, key=lambda u: (held[u], u == TOKENS)) if held else None


__all__ = ["SimLimits", "bound_by", "job_units"]
