"""``lane simulate --estimator NAME``: each job re-estimated online, at its submission.

A trace of real calls knows every job's input tokens (the prompt, known
before the call) and its output (known once it settled). With an estimator,
the simulator drops the trace's fixed ``est`` (input + ``--output-allowance``)
and asks the estimator, as the gate would, when the job is submitted: learned
from the jobs of its stage that *settled* before that moment in this very
simulation (each policy's run learns from its own settlements). The same code
the gate runs estimates: :func:`lane_plugin.estimators.learned` with
``ledger=False``, fed :meth:`~lane_plugin.estimators.Learned.observe` at every
settlement. Its fitted spread becomes the job's ``est_var``, what the ``lane``
policy keeps headroom for (``headroom_sigmas``).

Estimators:

- ``learned``: input tokens + the stage's learned output allowance (the mean of
  ``actual - input`` of its settled jobs); until a stage has ``min_jobs``
  settled, the trace's own allowance (``--output-allowance``).

The figures (:class:`EstimatorFigures`, ``--json`` key ``estimator``) count the
settled jobs estimated after their stage's ``warmup``-th settlement.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

ESTIMATORS = ("learned",)
WARMUP = 200


def check_name(name: str | None) -> str | None:
    """``name`` if it is a known estimator (None: the trace's own estimates), else ValueError."""
    if name is not None and name not in ESTIMATORS:
        raise ValueError(f"estimator={name!r} is not one of {', '.join(ESTIMATORS)}")
    return name


class OnlineEstimator:
    """One simulated run's estimator: estimates at submission, learns at settlement."""

    def __init__(self, name: str, trace, *, warmup: int = WARMUP) -> None:
        from ..estimators.learned import Learned
        from ..estimators.tokens import TokenCounter

        check_name(name)
        missing = sum(1 for x in trace.input_tokens if x is None)
        if missing:
            raise ValueError(
                f"estimator={name!r} needs every job's input tokens: {missing} of {len(trace)} jobs of "
                f"{trace.source or 'the trace'} have none (use a trace with input_tokens,output_tokens, "
                "an Azure or a Mooncake trace)"
            )
        self.name, self.trace, self.warmup = name, trace, warmup
        # The inputs come counted: the counter is never asked (chars/4 loads no tokenizer).
        self.impl = Learned(counter=TokenCounter(encoding="o200k_base", backend="chars/4"), ledger=False)
        self.settled: dict[str, int] = {}
        self.warm = bytearray(len(trace))

    def estimate(self, j: int) -> tuple[int, int]:
        """``(est, est_var)`` of job ``j`` now, from its stage's jobs settled so far."""
        tr = self.trace
        stage, n = tr.stage[j], tr.input_tokens[j]
        prior = max(0, tr.est[j] - n)  # the trace's own allowance until the stage has learned one
        b = self.impl.breakdown(input_tokens=n, stage=stage, expected_output=prior)
        self.warm[j] = self.settled.get(stage, 0) >= self.warmup
        return b.total, b.variance

    def observe(self, j: int) -> None:
        """Job ``j`` settled: learn from its input and its actual."""
        tr = self.trace
        stage = tr.stage[j]
        self.impl.observe(stage, tr.input_tokens[j], tr.actual[j])
        self.settled[stage] = self.settled.get(stage, 0) + 1


@dataclass(frozen=True)
class EstimatorFigures:
    """How an estimator did over the settled jobs estimated after warm-up (``--json``: ``estimator``).

    ``drift`` = Σ actual / Σ est; ``under_share`` the share of jobs with actual >
    est; ``overspend_share`` = Σ max(0, actual - est) / Σ actual; ``p90_ratio``
    the 90th percentile of actual / est; ``jobs`` how many jobs count.
    """

    name: str
    policy: str
    jobs: int
    warmup: int
    drift: float
    under_share: float
    overspend_share: float
    p90_ratio: float
    p99_ratio: float

    def as_dict(self) -> dict:
        return asdict(self)


def figures(name: str, policy: str, est: list[int], actual: list[int], counted, warmup: int) -> EstimatorFigures:
    """The figures over the jobs ``j`` with ``counted[j]`` true (estimated warm, and settled)."""
    pairs = [(e, a) for e, a, c in zip(est, actual, counted) if c]
    if not pairs:
        nan = math.nan
        return EstimatorFigures(name, policy, 0, warmup, nan, nan, nan, nan, nan)
    total_e = sum(e for e, _ in pairs)
    total_a = sum(a for _, a in pairs)
    under = sum(1 for e, a in pairs if a > e)
    over = sum(a - e for e, a in pairs if a > e)
    ratios = sorted(a / e for e, a in pairs)

    def q(p: float) -> float:
        return ratios[min(len(ratios) - 1, max(0, math.ceil(p * len(ratios)) - 1))]

    return EstimatorFigures(
        name,
        policy,
        len(pairs),
        warmup,
        total_a / total_e,
        under / len(pairs),
        over / total_a if total_a else 0.0,
        q(0.90),
        q(0.99),
    )


__all__ = ["ESTIMATORS", "WARMUP", "EstimatorFigures", "OnlineEstimator", "check_name", "figures"]
