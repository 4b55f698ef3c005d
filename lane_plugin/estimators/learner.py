"""The pure learner behind ``learned``: each stage's output allowance and its spread, online.

No ledger, no clock, no tokenizer: feed it ``(stage, input_tokens, actual)``
as jobs settle (the simulator does at each settlement; a refit does from the
ledger's newest settled jobs) and read the published allowance, the version
digest and the fitted spread. Its state is a list of ``estimator_state`` rows.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..checks import label, tokens
from ..errors import InvalidInput

NO_REVISION = "00000000"
Z99 = 2.326  # the standard normal's 99th percentile


@dataclass(frozen=True)
class StageFit:
    """The fitted residual (``actual - input``) of one stage: its centre and its spread.

    ``allowance`` is the published number estimates add (None until ``min_jobs``
    jobs settled); ``mean``, ``m2``, the quantiles and ``mean_input`` describe
    the newest ``jobs`` settled jobs.
    """

    stage: str
    jobs: int
    mean: float
    m2: float
    mean_input: float
    p50: float
    p90: float
    p99: float
    allowance: int | None

    @property
    def variance(self) -> float:
        """Sample variance of the residual (0 below two jobs)."""
        return self.m2 / (self.jobs - 1) if self.jobs > 1 else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.variance)

    def row(self, revision: str) -> dict:
        """This fit as an ``estimator_state`` row (without ``estimator`` and ``fitted_at``)."""
        return dict(
            stage=self.stage,
            revision=revision,
            allowance=int(self.allowance or 0),
            jobs=self.jobs,
            mean=self.mean,
            m2=self.m2,
            mean_input=self.mean_input,
            p50=self.p50,
            p90=self.p90,
            p99=self.p99,
        )


def _check_int(field: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidInput(field, value, f"expected a whole number of at least {low}")
    return value


def _quantile(sorted_values: list[int], q: float) -> float:
    """Linear-interpolated quantile (numpy's default) of sorted values."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def revision_of(allowances: Mapping[str, int]) -> str:
    """The 8-hex digest of published allowances: the ``#...`` of a learned version."""
    if not allowances:
        return NO_REVISION
    return hashlib.sha1(repr(sorted(allowances.items())).encode()).hexdigest()[:8]


class OutputLearner:
    """A pure online learner of each stage's output allowance: no ledger, no clock, no tokenizer.

    Feed it ``(stage, input_tokens, actual)`` as jobs settle; it keeps the
    newest ``window`` residuals per stage and publishes their mean (rounded)
    as the stage's allowance once ``min_jobs`` settled, re-publishing only when
    the mean moved by more than ``tolerance`` x (mean input + allowance).

    Args:
        window: residuals kept per stage (newest first out).
        min_jobs: settled jobs a stage needs before its allowance is published.
        tolerance: how far (a share of the stage's mean job size) the mean must
            move before the allowance (and the version) changes.

    Example:
        >>> ol = OutputLearner(min_jobs=2)
        >>> ol.observe("draft", 100, 150), ol.observe("draft", 100, 170)
        (False, True)
        >>> ol.allowances, ol.fit("draft").p50
        ({'draft': 60}, 60.0)
    """

    def __init__(self, *, window: int = 1000, min_jobs: int = 20, tolerance: float = 0.01):
        self.window = _check_int("window", window)
        self.min_jobs = _check_int("min_jobs", min_jobs)
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
            raise InvalidInput("tolerance", tolerance, "expected a number from 0 up to (not including) 1")
        self.tolerance = float(tolerance)
        self.allowances: dict[str, int] = {}
        self._samples: dict[str, deque[tuple[int, int]]] = {}
        self._sums: dict[str, list[int]] = {}  # stage: [Σ residual, Σ residual², Σ input]
        self._loaded: dict[str, StageFit] = {}
        self._counts: dict[str, int] = {}  # observations per stage, ever
        self._tails: dict[str, tuple[int, float]] = {}  # stage: (observations when p99 was sorted, p99)
        self._lock = threading.Lock()

    @property
    def revision(self) -> str:
        return revision_of(self.allowances)

    # -- learning ---------------------------------------------------------------------
    def observe(self, stage: str, input_tokens: int, actual: int) -> bool:
        """One settled job; True when the stage's published allowance changed."""
        stage = label("stage", stage, limit=200)
        input_tokens = tokens("input_tokens", input_tokens, low=0)
        actual = tokens("actual", actual, low=0)
        with self._lock:
            self._add(stage, input_tokens, actual)
            return self._publish(stage)

    def _add(self, stage: str, input_tokens: int, actual: int) -> None:
        q = self._samples.setdefault(stage, deque())
        s = self._sums.setdefault(stage, [0, 0, 0])
        r = actual - input_tokens
        self._counts[stage] = self._counts.get(stage, 0) + 1
        q.append((input_tokens, r))
        s[0] += r
        s[1] += r * r
        s[2] += input_tokens
        if len(q) > self.window:
            old_in, old_r = q.popleft()
            s[0] -= old_r
            s[1] -= old_r * old_r
            s[2] -= old_in

    def _publish(self, stage: str) -> bool:
        q = self._samples.get(stage)
        n = len(q) if q else 0
        if n < self.min_jobs:
            return False
        total, _, total_in = self._sums[stage]
        mean = total / n
        current = self.allowances.get(stage)
        scale = max(1.0, total_in / n + abs(current if current is not None else mean))
        if current is not None and abs(mean - current) <= self.tolerance * scale:
            return False
        new = int(round(mean))
        if new == current:
            return False
        self.allowances[stage] = new
        return True

    def learn(self, samples: Mapping[str, Iterable[tuple[int, int]]]) -> dict[str, tuple[int | None, int]]:
        """Refit from ``{stage: [(input_tokens, actual), ...]}`` (oldest first), replacing each stage's window.

        Returns ``{stage: (old allowance, new allowance)}`` for the stages whose
        published allowance changed.
        """
        changed = {}
        with self._lock:
            for stage, pairs in samples.items():
                old = self.allowances.get(stage)
                self._samples.pop(stage, None)
                self._sums.pop(stage, None)
                self._tails.pop(stage, None)
                self._loaded.pop(stage, None)
                for input_tokens, actual in list(pairs)[-self.window :]:
                    self._add(stage, int(input_tokens), int(actual))
                if self._publish(stage):
                    changed[stage] = (old, self.allowances[stage])
        return changed

    # -- reading ----------------------------------------------------------------------
    def allowance(self, stage: str | None) -> int | None:
        """The stage's published allowance, None until it has one."""
        return self.allowances.get(stage)

    def variance(self, stage: str | None) -> float | None:
        """The spread admission keeps headroom for (``job.est_var``), as a variance; None while unknown.

        The residual's sample variance, raised to what a normal spread with the
        same 99th percentile would have: ``((p99 - mean) / 2.326)**2``. Output
        lengths are heavy-tailed, and a variance alone underrates their upper
        tail (a few jobs in flight, one long answer). From this process's
        samples (the percentile re-sorted every ``1/20`` of the window), else the
        loaded state.
        """
        with self._lock:
            q = self._samples.get(stage)
            if q and len(q) > 1:
                n = len(q)
                total, total_sq, _ = self._sums[stage]
                mean = total / n
                var = max(0.0, (total_sq - total * total / n) / (n - 1))
                seen, p99 = self._tails.get(stage, (-1, 0.0))
                count = self._counts.get(stage, 0)
                if seen < 0 or count - seen >= max(1, n // 20):
                    p99 = _quantile(sorted(r for _, r in q), 0.99)
                    self._tails[stage] = (count, p99)
                return max(var, ((p99 - mean) / Z99) ** 2)
            loaded = self._loaded.get(stage)
        if loaded is None or loaded.jobs < 2:
            return None
        return max(loaded.variance, ((loaded.p99 - loaded.mean) / Z99) ** 2)

    def fit(self, stage: str) -> StageFit | None:
        """The stage's fitted residual (from this process's samples, else the loaded state)."""
        with self._lock:
            q = self._samples.get(stage)
            if not q:
                return self._loaded.get(stage)
            n = len(q)
            total, total_sq, total_in = self._sums[stage]
            mean = total / n
            m2 = max(0.0, total_sq - total * total / n)
            resid = sorted(r for _, r in q)
            return StageFit(
                stage,
                n,
                mean,
                m2,
                total_in / n,
                _quantile(resid, 0.5),
                _quantile(resid, 0.9),
                _quantile(resid, 0.99),
                self.allowances.get(stage),
            )

    def fits(self) -> dict[str, StageFit]:
        """Every stage's fit, by stage."""
        stages = sorted(set(self._samples) | set(self._loaded) | set(self.allowances))
        return {s: f for s in stages if (f := self.fit(s)) is not None}

    # -- the ledger row ---------------------------------------------------------------
    def rows(self) -> list[dict]:
        """Every stage's fit as ``estimator_state`` rows (``stage, revision, allowance, jobs, mean, m2, ...``)."""
        rev = self.revision
        return [fit.row(rev) for stage, fit in self.fits().items() if stage in self.allowances]

    def load(self, rows: Iterable[Mapping[str, Any]], *, replace: bool = False) -> None:
        """Restore published allowances and fitted spreads from ``estimator_state`` rows.

        With ``replace`` the rows become the whole published state (what another
        process refitted); samples observed in this process are kept.
        """
        with self._lock:
            allowances = {} if replace else dict(self.allowances)
            loaded = {} if replace else dict(self._loaded)
            for r in rows:
                stage = r["stage"]
                allowances[stage] = int(r["allowance"])
                loaded[stage] = StageFit(
                    stage,
                    int(r["jobs"]),
                    float(r["mean"]),
                    float(r["m2"]),
                    float(r["mean_input"]),
                    float(r["p50"]),
                    float(r["p90"]),
                    float(r["p99"]),
                    int(r["allowance"]),
                )
            # swapped whole: a thread estimating meanwhile sees the old state or the new, never half of each
            self.allowances, self._loaded = allowances, loaded

    def __repr__(self) -> str:
        return f"OutputLearner(window={self.window}, min_jobs={self.min_jobs}, allowances={self.allowances!r})"


__all__ = ["NO_REVISION", "OutputLearner", "StageFit", "revision_of"]
