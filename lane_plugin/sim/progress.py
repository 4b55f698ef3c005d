"""A one-line progress bar on stderr for long ``lane simulate`` runs.

Drawn only when asked (``--progress``) or when stderr is a terminal; at most
ten redraws a second, never wider than 79 columns, erased when done so that
what the command prints stays clean.
"""

from __future__ import annotations

import sys
import time

WIDTH = 79


def fmt_clock(seconds: float) -> str:
    """Simulated time: 42s, 12m, 5.5h, 3.2d."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7_200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172_800:
        return f"{seconds / 3_600:.1f}h"
    return f"{seconds / 86_400:.1f}d"


class ProgressBar:
    """Callable handed to :func:`lane_plugin.sim.engine.simulate` as ``progress``.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> bar = ProgressBar(["lane"], stream=out, every=0.0)
        >>> class S: policy, n, done, parked, t0 = "lane", 200, 50, 0, 0.0
        >>> bar(S(), 3_600.0)
        >>> out.getvalue().strip()[:40]
        'simulate lane 1/1 [#######..............'
    """

    def __init__(self, policies: list[str], *, stream=None, every: float = 0.1) -> None:
        self.policies = list(policies)
        self.stream = stream if stream is not None else sys.stderr
        self.every = every
        self._last = 0.0
        self._policy: str | None = None
        self._shown = False

    @staticmethod
    def wanted(flag: bool | None, stream=None) -> bool:
        """``--progress`` / ``--no-progress`` when given, else whether ``stream`` (stderr) is a terminal."""
        if flag is not None:
            return flag
        stream = stream if stream is not None else sys.stderr
        try:
            return stream.isatty()
        except (AttributeError, ValueError):
            return False

    def __call__(self, sim, t: float) -> None:
        now = time.monotonic()
        if now - self._last < self.every and sim.policy == self._policy:
            return
        self._last, self._policy = now, sim.policy
        k = self.policies.index(sim.policy) + 1 if sim.policy in self.policies else 1
        finished = sim.done + sim.parked
        frac = finished / sim.n if sim.n else 1.0
        head = f"simulate {sim.policy} {k}/{len(self.policies)} "
        tail = f" {frac:4.0%} {finished:,}/{sim.n:,} jobs, clock {fmt_clock(t - sim.t0)}"
        room = max(10, WIDTH - len(head) - len(tail) - 2)
        filled = int(room * frac)
        line = f"{head}[{'#' * filled}{'.' * (room - filled)}]{tail}"[:WIDTH]
        self.stream.write("\r" + line)
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        """Erase the bar."""
        if self._shown:
            self.stream.write("\r" + " " * WIDTH + "\r")
            self.stream.flush()
            self._shown = False


__all__ = ["ProgressBar", "fmt_clock"]
