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


class OverGenerated:
    """Output tokens of the requests a provider counting output as generated would have refused.

    Such a provider (issue 24's model of Anthropic's OTPM, as the emulator in :mod:`lane_plugin.testing` has
    it) refuses a request that arrives while its window of generated
    output is full (``amount`` or more in the last ``seconds``), and counts a call's output when it is
    generated. Counted in tokens, as the other meters: a refused request's output, once it is known.

    Example:
        >>> m = OverGenerated(100, 10.0)
        >>> m.request(0.0, 1); m.generated(1.0, 1, 120)
        >>> m.request(2.0, 2); m.generated(3.0, 2, 30)   # arrived at a full window (120): refused
        >>> m.request(11.5, 3); m.generated(12.0, 3, 40)  # the 120 left at t=11: 30 held, room
        >>> m.over
        30
    """

    __slots__ = ("amount", "seconds", "over", "total", "_q", "_refused")

    def __init__(self, amount: int, seconds: float) -> None:
        self.amount, self.seconds = amount, seconds
        self.over = self.total = 0
        self._q: deque[tuple[float, int]] = deque()
        self._refused: set[int] = set()

    def _slide(self, now: float) -> None:
        q = self._q
        while q and q[0][0] + self.seconds <= now:
            self.total -= q.popleft()[1]

    def request(self, now: float, j: int) -> None:
        """Request ``j`` reaches the provider at ``now``."""
        self._slide(now)
        if self.total >= self.amount:
            self._refused.add(j)

    def generated(self, now: float, j: int, tokens: int) -> None:
        """Request ``j`` generated ``tokens`` by ``now`` (times never go backwards)."""
        self._slide(now)
        self._q.append((now, tokens))
        self.total += tokens
        if j in self._refused:
            self._refused.discard(j)
            self.over += tokens


__all__ = ["OverBurst", "OverGenerated"]
