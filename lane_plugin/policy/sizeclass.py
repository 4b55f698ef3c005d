"""The size classes of the admission order (rule 7, :mod:`lane_plugin.policy.order`), learned from recent estimates.

Pure. A lane that knows its traffic puts a job whose estimate is above its boundary (the
``SIZE_CLASS_PCT``-th percentile of its last ``SIZE_CLASS_SAMPLE`` estimates) ``max_wait_seconds``
behind the jobs at or under it (:func:`lane_plugin.policy.order.priority`); a job finishing a run
under way keeps the continuous priority. The ledger refits the boundary where it refits the finishing
reserve (``ledger/runs.py``, every ``lane_plugin.policy.reserve.REFIT_SECONDS``), the simulator the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

# The boundary is learned from the lane's last SIZE_CLASS_SAMPLE estimates, none until
# SIZE_CLASS_MIN are known: their SIZE_CLASS_PCT-th percentile (benchmarks/bench_lean.py `learned60`).
SIZE_CLASS_SAMPLE, SIZE_CLASS_MIN, SIZE_CLASS_PCT = 500, 50, 60.0


def size_class_boundary(estimates: Iterable[int], pct: float = SIZE_CLASS_PCT) -> int | None:
    """The lane's size-class boundary: the ``pct``-th percentile of its recent ``estimates``.

    None (one continuous priority) until ``SIZE_CLASS_MIN`` estimates are known.

    Example:
        >>> size_class_boundary(range(1, 101)), size_class_boundary([5] * 10)
        (61, None)
    """
    ranked = sorted(estimates)
    if len(ranked) < SIZE_CLASS_MIN:
        return None
    if not 0 <= pct <= 100:
        raise ValueError(f"pct must be within 0..100, got {pct!r}")
    return int(ranked[min(len(ranked) - 1, int(pct / 100 * len(ranked)))])
