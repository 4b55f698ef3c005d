"""What a provider's sliding rate limiter would have refused: ``over_burst``.

Measured apart from the window the policies obey, so that a policy that keeps
its own count (the ledger's, for ``lane``) is judged by the same yardstick as
the baselines.
"""

from __future__ import annotations

from collections import deque


class OverBurst:
    """Tokens admitted past ``burst`` in any sliding window of ``seconds``, summed over admissions.

    At each admission the tokens that take the window's total past ``burst``
    (and no more than the job's own) count once: a provider counting this way
    would have refused that many tokens' worth of requests. ``seconds <= 0``:
    no window, nothing is over.

    Example:
        >>> m = OverBurst(100, 10.0)
        >>> for t, n in [(0, 60), (5, 60), (9, 30), (10, 10)]:
        ...     m.charge(float(t), n)
        >>> m.over  # 120 at t=5 (20 over), 150 at t=9 (30 more); at t=10 the first 60 left: 60 + 30 + 10
        50
    """

    __slots__ = ("burst", "seconds", "over", "total", "_q")

    def __init__(self, burst: int, seconds: float) -> None:
        self.burst, self.seconds = burst, seconds
        self.over = self.total = 0
        self._q: deque[tuple[float, int]] = deque()

    def charge(self, now: float, tokens: int) -> None:
        """Count ``tokens`` requested at ``now`` (times never go backwards)."""
        w = self.seconds
        if w <= 0:
            return
        q = self._q
        while q and q[0][0] + w <= now:
            self.total -= q.popleft()[1]
        before = self.total
        q.append((now, tokens))
        self.total = after = before + tokens
        if after > self.burst:
            self.over += after - max(before, self.burst)


__all__ = ["OverBurst"]
