"""The drift allowance: what admission charges past the estimates, learned from settled work.

Pure functions (no database, no clock), used by admission's ceiling rule (rule 3 of
:mod:`lane_plugin.policy.admission`), the ledger's refit (:mod:`lane_plugin.ledger.runs`) and the simulator.

A lane whose jobs settle above their estimates (a fixed output allowance below
the real mean, a generator's drift) overruns the ceiling by what the jobs in
flight at its last admissions overran. Three numbers, learned from the lane's
latest :data:`DRIFT_SAMPLE` settlements, keep that out:

- ``drift``: ``sum(actual) / sum(est)`` when above 1 (else 1): the jobs in
  flight and the candidate are charged at their drift-corrected size,
  ``est + ceil((drift - 1) * est)`` summed;
- ``spread``: the :data:`SPREAD_QUANTILE` quantile of what a settlement ran past
  its drift-corrected size, kept free for every job in flight and the candidate;
- ``overrun``: the most one settlement ran past its drift-corrected size, kept
  free once. Jobs still in flight when the ceiling nears are the long ones
  (service time follows output length), so what settles last runs past its
  estimate more than the average job does; no mean or quantile covers one
  answer 60 times its estimate.

All three bite only near the ceiling: they add to what an admission must leave
free, never to what is reserved or spent.

The allowance is a heuristic and must never close a lane: what it keeps free
is capped (:func:`capped`) at :data:`DRIFT_CAP_FRACTION` of the ceiling and at
what the ceiling leaves the candidate, ``min(over_charge(...), ceiling * 5 // 100,
max(0, ceiling - est))``. One outlier settlement (a ``report_usage`` typo: an
estimate of 1,000 settled at 150,000) then costs a lane at most its last 5%, and
a job whose estimate fits the empty lane still fits it after a reset: nothing
settling is needed to relearn the allowance.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where it is used (fit_drift_arrays): the ledger's fit never needs it
    from numpy.typing import ArrayLike, NDArray

# Settlements the allowance is learned from: the lane's latest this many (refit with the profile).
DRIFT_SAMPLE = 1000
# The quantile of the overruns kept free for each job in flight.
SPREAD_QUANTILE = 0.9
# The most the allowance keeps free: the last 5% of the ceiling. Learned from settlements, one outlier
# could otherwise keep every job out for good (nothing admitted settles to relearn it); capped, a lane
# stays usable to 95% of its ceiling whatever was learned. The spend targets of lanes that learn an
# allowance ask for >= 95% of the ceiling (docs/performance_targets.md), so the cap never costs one of
# them on its own; what an overrun past the cap settles past the ceiling is what the cap gives up.
DRIFT_CAP_FRACTION = 0.05
_CAP_PERCENT = round(DRIFT_CAP_FRACTION * 100)  # integer arithmetic: floor(ceiling * 5 / 100)


def drift_cap(ceiling: int) -> int:
    """The most the drift allowance keeps free in a lane of ``ceiling``: ``floor(ceiling * 5 / 100)``.

    Example:
        >>> drift_cap(100_000), drift_cap(19)
        (5000, 0)
    """
    return ceiling * _CAP_PERCENT // 100


def capped(over: int, ceiling: int, est: int) -> int:
    """The tokens the drift allowance ``over`` keeps free for a candidate of ``est`` in a lane of ``ceiling``.

    ``min(over, drift_cap(ceiling), max(0, ceiling - est))``: at most the last 5% of the ceiling, and never
    more than the ceiling leaves the candidate (a job whose estimate fits the empty lane fits it after a reset).

    Example:
        >>> capped(135_454, 100_000, 1_000), capped(300, 100_000, 1_000), capped(3_000, 100_000, 98_000)
        (5000, 300, 2000)
    """
    return min(over, ceiling * _CAP_PERCENT // 100, max(0, ceiling - est))


def over_charge(drift: float, overrun: int, spread: int, tokens: int, jobs: int) -> int:
    """Tokens kept free past ``tokens`` of estimates in ``jobs`` jobs (in flight with the candidate).

    ``ceil((drift - 1) * tokens)`` (drift > 1, read to 4 decimals), ``spread`` per job, and ``overrun`` once.

    Example:
        >>> over_charge(1.3, 0, 0, 1_000, 2), over_charge(1.0, 250, 0, 1_000, 2), over_charge(1.25, 10, 5, 3, 2)
        (300, 250, 21)
    """
    extra = round(drift * 10_000) - 10_000  # drift in 1/10,000 (fit_drift's precision): integer arithmetic
    return overrun + spread * jobs + (-(-extra * tokens // 10_000) if extra > 0 and tokens > 0 else 0)


def fit_drift(settled: Iterable[tuple[int, int]]) -> tuple[float, int, int]:
    """Learn ``(drift, overrun, spread)`` from settlements ``(est, actual)`` (the lane's latest :data:`DRIFT_SAMPLE`).

    ``drift`` is ``sum(actual) / sum(est)`` rounded up to 4 decimals, 1.0 when
    that is not above 1 (estimates that cover the bill need no allowance) or
    nothing was settled. Each settlement's overrun is ``actual`` past its
    drift-corrected size (``est + ceil((drift - 1) * est)``), at least 0:
    ``overrun`` is the largest, ``spread`` the :data:`SPREAD_QUANTILE` quantile.

    Example:
        >>> fit_drift([(100, 130), (200, 260)])
        (1.3, 0, 0)
        >>> fit_drift([(100, 90), (100, 150), (100, 40)])   # drift 0.93: none; one ran 50 past
        (1.0, 50, 50)
        >>> fit_drift([])
        (1.0, 0, 0)
    """
    rows = settled if isinstance(settled, (list, tuple)) else list(settled)
    if not rows:
        return 1.0, 0, 0
    # Python integers, not numpy: the ledger's refit runs this inside a gated task's process, where a first
    # import of numpy can fail (Prefect's own test suite reloads modules: "cannot load module more than once
    # per process"), and 1,000 rows every REFIT_SECONDS need no vectorising. fit_drift_arrays is the
    # simulator's, on its numpy ring; tests/policy check the two agree.
    est = [int(e) for e, _ in rows]
    actual = [int(a) for _, a in rows]
    total_est, total_actual = sum(est), sum(actual)
    drift = 1.0
    if total_est > 0 and total_actual > total_est:
        drift = -(-total_actual * 10_000 // total_est) / 10_000
    extra = round(drift * 10_000) - 10_000  # over_charge(drift, 0, 0, e, 0), per settlement
    overs = sorted(a - e + (-extra * e // 10_000) for e, a in zip(est, actual))
    k = min(len(overs) - 1, math.ceil(SPREAD_QUANTILE * len(overs)) - 1)
    return drift, max(0, overs[-1]), max(0, overs[k])


def fit_drift_arrays(est: ArrayLike, actual: ArrayLike) -> tuple[float, int, int]:
    """:func:`fit_drift` of the settlements ``zip(est, actual)``, given as two equal-length numpy arrays of integers.

    What the simulator calls on its ring of the latest settlements: the sample's order does not matter.
    Vectorised (a refit reads 1,000 settlements); where int64 could overflow, on Python integers.
    """
    import numpy as np

    e, a = np.asarray(est), np.asarray(actual)
    n = len(e)
    if n == 0:
        return 1.0, 0, 0
    e, a = _exact(e), _exact(a)  # int64 (or Python integers): no arithmetic in a narrow dtype
    big = max(abs(int(e.max())), abs(int(e.min())), abs(int(a.max())), abs(int(a.min())))
    # The sums, or est * extra below, could pass int64: then exact Python integers.
    if e.dtype != object and big * max(n, 10_000) >= 2**62:
        e, a = e.astype(object), a.astype(object)
    total_est, total_actual = int(e.sum()), int(a.sum())
    drift = 1.0
    if total_est > 0 and total_actual > total_est:
        drift = -(-total_actual * 10_000 // total_est) / 10_000
    extra = round(drift * 10_000) - 10_000  # over_charge(drift, 0, 0, e, 0), vectorised: it runs per settlement
    if e.dtype != object and big * max(extra, 1) >= 2**62:
        e, a = e.astype(object), a.astype(object)
    overs = a - e + (-extra * e // 10_000)
    k = min(n - 1, math.ceil(SPREAD_QUANTILE * n) - 1)
    q = np.partition(overs, k)[k] if overs.dtype != object else sorted(overs)[k]
    return drift, max(0, int(overs.max())), max(0, int(q))


def _exact(a: NDArray[Any]) -> NDArray[Any]:
    """``a`` as int64, or as Python integers where int64 cannot hold it (unsigned values past 2**63 - 1)."""
    import numpy as np

    if a.dtype == np.int64 or a.dtype.kind not in "iub":  # (object: Python integers already; never truncate floats)
        return a
    if a.dtype.kind == "u" and a.dtype.itemsize >= 8 and int(a.max()) > np.iinfo(np.int64).max:
        return a.astype(object)
    return a.astype(np.int64)
