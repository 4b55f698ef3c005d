"""A sliding rate window on a simulated clock, counted as the ledger counts it.

At an admission at time ``t`` the rate tokens admitted in ``(t - seconds, t]``
plus the new charge must stay within the burst: the ledger keeps one
``rate_charge`` row per admission and prunes those at or before ``t - seconds``;
this keeps the same charges in a deque. A charge can be *trued up* (replaced by
the tokens really used) while it is still in the window, as the ledger does for
lanes whose provider counts actual tokens.

Example:
    >>> w = RateWindow(60.0)
    >>> first = w.charge(0.0, 300); second = w.charge(30.0, 200)
    >>> w.used(59.9), w.used(60.0), w.used(90.0)
    (500, 200, 0)
    >>> third = w.charge(100.0, 400)
    >>> w.free_at(100.0, 500 - 450)   # room for 450 under a 500 burst: used <= 50 from t=160
    160.0
"""

from __future__ import annotations

from collections import deque

from ..policy.window import window_expiry


class Charge:
    """One admission's rate tokens; ``live`` until it leaves the window."""

    __slots__ = ("at", "cost", "live")

    def __init__(self, at: float, cost: int) -> None:
        self.at, self.cost, self.live = at, cost, True


class RateWindow:
    """Rate tokens admitted in the last ``seconds`` (0: no window, nothing is counted)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.charges: deque[Charge] = deque()
        self.total = 0

    def _prune(self, t: float) -> None:
        cut = t - self.seconds
        charges = self.charges
        while charges and charges[0].at <= cut:
            old = charges.popleft()
            old.live = False
            self.total -= old.cost

    def used(self, t: float) -> int:
        """Rate tokens admitted in ``(t - seconds, t]``."""
        self._prune(t)
        return self.total

    def charge(self, t: float, cost: int) -> Charge | None:
        """Count ``cost`` admitted at ``t`` (times never go backwards); returns its handle."""
        if self.seconds <= 0:
            return None
        c = Charge(t, cost)
        self.charges.append(c)
        self.total += cost
        return c

    def true_up(self, c: Charge | None, cost: int) -> None:
        """Replace a charge still in the window by ``cost`` (settlement on an ``actual`` basis)."""
        if c is not None and c.live:
            self.total += cost - c.cost
            c.cost = cost

    def redate(self, c: Charge | None, t: float, cost: int) -> Charge | None:
        """Count ``cost`` from ``t`` in place of charge ``c`` (still in the window, or already gone): an output
        charge at its settlement, as the provider counts output when it is generated."""
        if c is not None and c.live:
            self.total -= c.cost
            c.cost = 0  # (stays in the deque until it leaves, counting nothing)
        return self.charge(t, cost)

    def free_at(self, t: float, limit: int) -> float | None:
        """Earliest time ``>= t`` at which the window holds at most ``limit``; None if never (limit < 0)."""
        used = self.used(t)
        if used <= limit:
            return t
        for c in self.charges:
            used -= c.cost
            if used <= limit:
                return window_expiry(c.at, self.seconds)
        return None
