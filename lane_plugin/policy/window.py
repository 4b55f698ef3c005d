"""The sliding burst window's clock (admission rule 6): when a charge has left the window; pure."""

from __future__ import annotations

import math


def window_expiry(at: float, window_seconds: float) -> float:
    """The first instant ``t`` at which a charge admitted at ``at`` has left the window (``at <= t - window_seconds``).

    ``at + window_seconds`` can round one step short, where the ledger would still count it.

    Example:
        >>> window_expiry(10.0, 1.0)
        11.0
        >>> t = window_expiry(0.1, 0.2); t - 0.2 >= 0.1
        True
    """
    t = at + window_seconds
    while t - window_seconds < at:
        t = math.nextafter(t, math.inf)
    return t
