"""``learned``: exact input tokens plus an output allowance per stage, learned from settled jobs.

On real traffic the error of an estimate is additive, not a factor: output
length is heavy-tailed and close to uncorrelated with input length (the Azure
and Mooncake traces in ``shared/traces``), so ``calibrated`` (a factor on the
estimate) fixes the sum while a large share of jobs stays under-estimated. A
learned estimate is::

    est = input tokens (counted exactly, offline)  +  allowance[stage]

where ``allowance[stage]`` is the MEAN of ``actual - input`` over the stage's
newest settled jobs: no padding per job, so drift (Σ actual / Σ est) sits at
1.0. The spread of that residual (count, mean, M2 = Σ squared deviations,
p50 / p90 / p99) is fitted too and stored beside it: admission headroom for
the variance of what is in flight belongs to the lane, not to each job.

The state lives in the ledger (table ``estimator_state``), shared by every
process and machine; it is refitted on demand (``lane estimators refit``), by
the scheduled drift-report flow, or in process (:meth:`OutputLearner.observe`,
what a simulator calls at each settlement). A published allowance moves only
when the fitted mean has moved by more than ``tolerance`` of the stage's mean
job size, and the version (``learned(o200k_base)#<digest>``) changes exactly
then, as ``calibrated``'s does when a factor changes.

Learning needs each job's input tokens at settlement: the gate records them at
intake (``job.est_input``) when its estimate came from an estimator that knows
them (this one, as the admission estimator or as a shadow). Jobs billed their
estimate because usage was missing are never learned from.

Example:
    >>> est = learned(encoding="o200k_base", ledger=False, min_jobs=3)
    >>> for actual in (1100, 1300, 1200):
    ...     _ = est.observe("critique", 1000, actual)
    >>> est.allowance("critique"), est.estimate(1000, stage="critique")
    (200, 1200)
    >>> est.version.startswith(f"learned({est.counter.label})#")
    True
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..checks import label, tokens
from ..errors import InvalidInput, LaneError
from .basic import at_least_one
from .learner import OutputLearner, StageFit, revision_of
from .tokens import TokenCounter

log = logging.getLogger("lane_plugin.estimators")


@dataclass(frozen=True)
class Estimate:
    """An estimate with its parts: ``total = input_tokens + allowance`` (at least 1).

    The gate submits ``total`` as the job's estimate, ``input_tokens`` as its
    ``est_input`` and ``variance`` (the stage's fitted variance of ``actual -
    est``, rounded up; 0 while unknown) as its ``est_var``, what admission keeps
    headroom for; a callable ``estimate=`` may return one of these.
    """

    total: int
    input_tokens: int | None
    allowance: int
    version: str
    variance: int = 0

    def __int__(self) -> int:
        return self.total


class Learned:
    """Exact input tokens plus a learned output allowance per stage; see :func:`learned`."""

    def __init__(
        self,
        model: str | None = None,
        *,
        encoding: str | None = None,
        counter: TokenCounter | None = None,
        name: str = "learned",
        prior: int | Mapping[str, int] = 0,
        window: int = 1000,
        min_jobs: int = 20,
        tolerance: float = 0.01,
        ledger: Any = None,
        refresh: float = 60.0,
    ):
        self.name = label("name", name)
        self.counter = counter if counter is not None else TokenCounter(model, encoding=encoding)
        if isinstance(prior, Mapping):
            self.prior: int | dict[str, int] = {
                label("stage", s, limit=200): tokens(f"prior for stage {s!r}", n, low=0) for s, n in prior.items()
            }
        else:
            self.prior = tokens("prior", prior, low=0)
        self.learner = OutputLearner(window=window, min_jobs=min_jobs, tolerance=tolerance)
        if isinstance(refresh, bool) or not isinstance(refresh, (int, float)) or refresh < 0:
            raise InvalidInput("refresh", refresh, "expected seconds (>= 0) between reads of the ledger's state")
        self.refresh = float(refresh)
        self._ledger_arg = ledger
        self._ledger = None
        self._synced_at: float | None = None
        self._sync_lock = threading.Lock()

    # -- the shared state ------------------------------------------------------------
    @property
    def shared(self) -> bool:
        """Whether the state is read from (and refitted into) a ledger."""
        return self._ledger_arg is not False

    def ledger(self):
        """The ledger this estimator's state lives in (opened on first use)."""
        if not self.shared:
            raise LaneError(f"estimator {self.name!r} was made with ledger=False: its state lives in this process")
        if self._ledger is None:
            from ..ledger import Ledger

            arg = self._ledger_arg
            self._ledger = arg if isinstance(arg, Ledger) else Ledger(arg)
        return self._ledger

    def sync(self, *, force: bool = False) -> None:
        """Read the fitted state from the ledger, at most every ``refresh`` seconds unless ``force``."""
        if not self.shared:
            return
        with self._sync_lock:
            now = time.monotonic()
            if not force and self._synced_at is not None and now - self._synced_at < self.refresh:
                return
            try:
                rows = self.ledger().estimator_state(self.name)
            except LaneError as exc:  # keep estimating from what we had; the submit will report the ledger
                self._synced_at = now
                log.warning(
                    "learned estimator %r: cannot read its state from the ledger (%s); "
                    "estimating from the state it had",
                    self.name,
                    exc,
                )
                return
            self.learner.load(rows, replace=True)
            self._synced_at = now

    def refit(self, ledger: Any = None, *, lane: str | None = None) -> RefitResult:
        """Learn from the ledger's newest settled jobs, store the state there, and use it now."""
        led = ledger if ledger is not None else self.ledger()
        result = refit(
            led,
            estimator=self.name,
            window=self.learner.window,
            min_jobs=self.learner.min_jobs,
            tolerance=self.learner.tolerance,
            lane=lane,
        )
        with self._sync_lock:
            self.learner.load(led.estimator_state(self.name), replace=True)
            self._synced_at = time.monotonic()
        return result

    # -- estimating -------------------------------------------------------------------
    @property
    def version(self) -> str:
        """``<name>(<what counts the input>)#<digest of the allowances>``: new whenever an allowance is."""
        self.sync()
        return f"{self.name}({self.counter.label})#{self.learner.revision}"

    def input_tokens(self, prompt: Any = None, *, tools: Any = None) -> int:
        """Input tokens of a prompt (a string or chat messages); an int is taken as already counted."""
        if isinstance(prompt, int) and not isinstance(prompt, bool):
            return tokens("input_tokens", prompt, low=0)
        return self.counter.count_prompt(prompt, tools=tools)

    def allowance(self, stage: str | None, *, expected_output: int | None = None) -> int:
        """What the stage's jobs cost beyond their input: learned, else ``expected_output``, else the prior."""
        self.sync()
        learned_value = self.learner.allowance(stage)
        if learned_value is not None:
            return learned_value
        if expected_output is not None:
            return tokens("expected_output", expected_output, low=0)
        if isinstance(self.prior, dict):
            return self.prior.get(stage, 0)
        return self.prior

    def breakdown(
        self,
        prompt: Any = None,
        *args,
        stage: str | None = None,
        input_tokens: int | None = None,
        tools: Any = None,
        expected_output: int | None = None,
        **kwargs,
    ) -> Estimate:
        """The estimate with its parts, for ``prompt`` (or ``input_tokens`` already counted)."""
        n = (
            tokens("input_tokens", input_tokens, low=0)
            if input_tokens is not None
            else self.input_tokens(prompt, tools=tools)
        )
        extra = self.allowance(stage, expected_output=expected_output)
        var = self.learner.variance(stage)
        return Estimate(at_least_one(n + extra), n, extra, self.version, 0 if var is None else math.ceil(var))

    def estimate(self, *args, **kwargs) -> int:
        """``input tokens + allowance[stage]``: ``estimate(prompt, stage=...)`` or ``estimate(input_tokens=n, stage=...)``."""
        return self.breakdown(*args, **kwargs).total

    def observe(self, stage: str, input_tokens: int, actual: int) -> bool:
        """Learn from one settled job in this process; True when the allowance (and version) changed."""
        return self.learner.observe(stage, input_tokens, actual)

    def spread(self, stage: str) -> StageFit | None:
        """The stage's fitted residual: mean, variance, quantiles (for admission headroom)."""
        self.sync()
        return self.learner.fit(stage)

    def __repr__(self) -> str:
        return f"Learned(name={self.name!r}, counter={self.counter!r}, allowances={self.learner.allowances!r})"


def learned(model: str | None = None, **options) -> Learned:
    """Estimate ``input tokens + a learned output allowance per stage``.

    Args:
        model: the model name; picks the tokenizer (``gpt-4o`` -> o200k_base).
        encoding: the encoding instead of a model (``o200k_base``, ``cl100k_base``).
        counter: a :class:`~lane_plugin.estimators.tokens.TokenCounter` of your own.
        name: the estimator's name: its state's key in the ledger (default ``learned``).
        prior: output tokens to add while a stage has no learned allowance yet
            (a number or a mapping by stage; default 0). A per-call
            ``expected_output=`` (e.g. the request's ``max_tokens``) overrides it.
        window: newest settled jobs per stage to learn from (default 1000).
        min_jobs: settled jobs a stage needs before its allowance is learned (default 20).
        tolerance: share of the stage's mean job size the mean must move before
            the allowance and the version change (default 0.01).
        ledger: where the state lives: a :class:`~lane_plugin.Ledger`, a URL,
            None for the default ledger (``LANE_DATABASE_URL``), or False to keep
            it in this process (a simulator feeding :meth:`Learned.observe`).
        refresh: seconds between reads of the ledger's state (default 60).

    Example:
        >>> est = learned("gpt-4o", ledger=False, prior={"draft": 300})
        >>> b = est.breakdown([{"role": "user", "content": "Summarise this."}], stage="draft")
        >>> b.allowance, b.total == b.input_tokens + 300
        (300, True)
    """
    return Learned(model, **options)


@dataclass(frozen=True)
class RefitResult:
    """What a refit did: the revision before and after, the allowances that moved, every stage's fit."""

    estimator: str
    before: str
    after: str
    changed: dict[str, tuple[int | None, int]]
    fits: dict[str, StageFit]
    min_jobs: int = 20

    def lines(self) -> list[str]:
        """One line per stage, as ``lane estimators refit`` prints them."""
        out = []
        for stage, fit in self.fits.items():
            move = self.changed.get(stage)
            if fit.allowance is None:
                what = f"no allowance yet ({fit.jobs} of {self.min_jobs} jobs)"
            elif move:
                what = (
                    f"allowance {move[0]} -> {move[1]}" if move[0] is not None else f"allowance {fit.allowance} (new)"
                )
            else:
                what = f"allowance {fit.allowance} (kept)"
            out.append(
                f"{stage}: {what}; {fit.jobs} jobs, mean {fit.mean:.0f}, sd {fit.std:.0f}, "
                f"p90 {fit.p90:.0f}, mean input {fit.mean_input:.0f}"
            )
        return out

    def outcome(self) -> str:
        """What the refit came to, in words: nothing to learn from, or the version (moved or not).

        Example:
            >>> RefitResult("learned", "", "", {}, {}).outcome()
            'nothing to learn from: no done job recorded its input tokens (estimate with learned(), admitting or as a shadow)'
        """
        if not self.fits:
            return (
                "nothing to learn from: no done job recorded its input tokens "
                "(estimate with learned(), admitting or as a shadow)"
            )
        return "version " + ("unchanged" if self.before == self.after else f"#{self.before} -> #{self.after}")


def refit(
    ledger,
    *,
    estimator: str = "learned",
    window: int = 1000,
    min_jobs: int = 20,
    tolerance: float = 0.01,
    lane: str | None = None,
) -> RefitResult:
    """Refit a learned estimator's state from the ledger's settled jobs and store it there.

    Reads the previous state (so a published allowance only moves past
    ``tolerance``), learns from the newest ``window`` jobs per stage that
    recorded their input tokens, and writes every stage's fit back in one
    transaction. The scheduled drift-report flow and ``lane estimators refit``
    call this.

    Example:
        >>> refit(Ledger(url)).changed                          # doctest: +SKIP
        {'critique': (None, 452)}
    """
    estimator = label("estimator", estimator)
    learner = OutputLearner(window=window, min_jobs=min_jobs, tolerance=tolerance)
    learner.load(ledger.estimator_state(estimator))
    before = learner.revision
    changed = learner.learn(ledger.output_samples(window=learner.window, lane=lane))
    ledger.save_estimator_state(estimator, learner.rows())
    return RefitResult(estimator, before, learner.revision, changed, learner.fits(), learner.min_jobs)


def refit_all(ledger, *, lane: str | None = None) -> list[RefitResult]:
    """Refit every learned estimator that has state in the ledger (``learned`` when none has yet).

    What the scheduled drift-report flow runs. Each is refitted with the
    default ``window``, ``min_jobs`` and ``tolerance``; an estimator made with
    other options refits itself with :meth:`Learned.refit` (or
    ``lane estimators refit --window ...``).

    Example:
        >>> [r.after for r in refit_all(Ledger(url))]                  # doctest: +SKIP
        ['5daa705d']
    """
    names = sorted({r["estimator"] for r in ledger.estimator_state()}) or ["learned"]
    return [refit(ledger, estimator=name, lane=lane) for name in names]


__all__ = [
    "Estimate",
    "Learned",
    "OutputLearner",
    "RefitResult",
    "StageFit",
    "learned",
    "refit",
    "refit_all",
    "revision_of",
]
