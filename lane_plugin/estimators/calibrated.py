"""``calibrated(base)``: any estimator times a per-stage factor learned from settled jobs.

The article: "Estimators drift. Version the estimator. Store est_v2 beside est
so drift is attributable, not mysterious." A calibrated estimator's version
changes whenever a factor does, and :func:`submit_kwargs` records other
estimators' numbers beside the admission one as shadow estimates.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping

from ..checks import label
from ..errors import InvalidInput
from .basic import Estimator, at_least_one


class Calibrated:
    """``base`` times a per-stage factor learned from settled jobs; see :func:`calibrated`."""

    name = "calibrated"

    def __init__(
        self,
        base: Estimator,
        *,
        quantile: float = 0.6,
        window: int = 200,
        min_jobs: int = 20,
        step: float = 0.01,
        factors: Mapping[str, float] | None = None,
    ):
        if not isinstance(base, Estimator):
            raise InvalidInput("base", base, "expected an estimator with name, version and estimate()")
        if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0.5 <= quantile < 1:
            raise InvalidInput("quantile", quantile, "expected a number from 0.5 up to (not including) 1")
        for field, value, low in (("window", window, 1), ("min_jobs", min_jobs, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidInput(field, value, f"expected a whole number of at least {low}")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step <= 1:
            raise InvalidInput("step", step, "expected a number above 0 and at most 1")
        self.base = base
        self.quantile = float(quantile)
        self.window = window
        self.min_jobs = min_jobs
        self.step = float(step)
        self.factors: dict[str, float] = {}
        for stage, f in (factors or {}).items():
            self.factors[label("stage", stage)] = self._check_factor(stage, f)

    def _check_factor(self, stage, f) -> float:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not (math.isfinite(f) and f > 0):
            raise InvalidInput(f"factor for stage {stage!r}", f, "expected a positive number")
        return round(round(float(f) / self.step) * self.step, 6) or self.step

    @property
    def version(self) -> str:
        """``calibrated(<base version>)#<digest of the factors>``: new whenever a factor changes."""
        shown = sorted((s, f) for s, f in self.factors.items() if f != 1.0)
        digest = hashlib.sha1(repr(shown).encode()).hexdigest()[:8] if shown else "00000000"
        return f"{self.name}({self.base.version})#{digest}"

    def factor(self, stage: str | None) -> float:
        return self.factors.get(stage, 1.0)

    def estimate(self, *args, stage: str | None = None, **kwargs) -> int:
        return at_least_one(self.base.estimate(*args, stage=stage, **kwargs) * self.factor(stage))

    def learn(self, samples: Mapping[str, Iterable[tuple[int, int]]]) -> dict[str, float]:
        """Refit from ``{stage: [(base_est, actual), ...]}`` (newest last); returns changed factors.

        A stage with fewer than ``min_jobs`` samples keeps its factor. The factor
        is the ``quantile`` of the per-job ratio ``actual / base_est`` over the
        newest ``window`` samples: a quantile, not the mean, so that one runaway
        job does not move it; at or above the median, so that with skewed noise
        the lane errs towards promising too much room, never too little.
        """
        changed = {}
        for stage, pairs in samples.items():
            ratios = sorted(a / e for e, a in list(pairs)[-self.window :] if e > 0)
            if len(ratios) < self.min_jobs:
                continue
            f = self._check_factor(stage, _quantile(ratios, self.quantile))
            if f != self.factors.get(stage, 1.0):
                changed[stage] = f
                self.factors[stage] = f
        return changed

    def refit(self, ledger, *, lane: str | None = None) -> dict[str, float]:
        """Learn from the ledger's newest settled jobs that carry a base estimate.

        A job counts if it was admitted with the base version (``job.est``) or
        carries it as a shadow estimate. Returns the factors that changed.
        """
        return self.learn(base_samples(ledger, self.base.version, lane=lane, window=self.window))

    def __repr__(self) -> str:
        return f"Calibrated({self.base!r}, quantile={self.quantile}, factors={self.factors!r})"


def calibrated(base: Estimator, **options) -> Calibrated:
    """Wrap ``base`` so its estimates are multiplied by a per-stage learned factor.

    Args:
        base: the estimator to calibrate.
        quantile: which quantile of ``actual / base_est`` becomes the factor (default 0.6).
        window: how many of the newest settled jobs per stage to learn from (default 200).
        min_jobs: a stage needs this many before it is calibrated (default 20).
        step: factors are rounded to this step, so noise does not mint versions (default 0.01).
        factors: starting factors by stage (e.g. restored from a previous run).

    Example:
        >>> cal = calibrated(Constant({"draft": 1000}), min_jobs=3)
        >>> cal.learn({"draft": [(1000, 1800), (1000, 2000), (1000, 2200)]})
        {'draft': 2.04}
        >>> cal.estimate(stage="draft"), cal.version
        (2040, 'calibrated(const-v1)#5daa705d')
    """
    return Calibrated(base, **options)


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method) of sorted values."""
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def base_samples(
    ledger, version: str, *, lane: str | None = None, window: int = 200
) -> dict[str, list[tuple[int, int]]]:
    """``{stage: [(est, actual), ...]}`` of done jobs estimated by ``version``, oldest first.

    Reads the newest ``window`` per stage from the admission estimate and the
    shadow estimates together.
    """
    out: dict[str, list[tuple[float, int, int]]] = {}
    for r in ledger.estimator_samples(version, lane=lane):
        out.setdefault(r["stage"], []).append((r["finished_at"] or 0.0, int(r["est"]), int(r["actual"])))
    return {s: [(e, a) for _, e, a in sorted(v)[-window:]] for s, v in out.items()}


def submit_kwargs(primary: Estimator, shadows: Iterable[Estimator] = (), *args, **kwargs) -> dict:
    """``est``, ``est_version``, ``shadows`` and ``est_input`` for :meth:`Ledger.submit` from estimators.

    Admit with ``primary`` and record every other estimator's number beside it,
    so ``lane report --by stage,version`` compares them on the same jobs.
    ``est_input`` is the job's counted input tokens when an estimator knows
    them (a :func:`~lane_plugin.estimators.learned` one, admitting or in the
    shadows), else None: recorded with the job, it is what a learned estimator
    learns from once the job settles. When the admitting estimator knows its
    spread (``learned``), ``est_var`` rides along too: admission keeps headroom for it.

    Example:
        >>> base = Constant({"draft": 1000})
        >>> submit_kwargs(calibrated(base), [base], stage="draft")
        {'est': 1000, 'est_version': 'calibrated(const-v1)#00000000', 'shadows': {'const-v1': 1000}, 'est_input': None}
    """
    est, est_input, est_var = _estimate(primary, args, kwargs)
    out = {"est": est, "est_version": primary.version, "shadows": {}, "est_input": est_input}
    if est_var:
        out["est_var"] = est_var
    for other in shadows:
        if other.version != primary.version:
            out["shadows"][other.version], known, _ = _estimate(other, args, kwargs)
            if out["est_input"] is None:
                out["est_input"] = known
    return out


def _estimate(estimator: Estimator, args: tuple, kwargs: dict) -> tuple[int, int | None, int]:
    """An estimator's number and, if it knows them, the input tokens behind it and its spread (variance)."""
    breakdown = getattr(estimator, "breakdown", None)
    if callable(breakdown):
        b = breakdown(*args, **kwargs)
        return b.total, b.input_tokens, getattr(b, "variance", 0) or 0
    return estimator.estimate(*args, **kwargs), None, 0
