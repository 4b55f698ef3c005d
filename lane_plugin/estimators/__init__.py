"""Estimators: how many tokens a job will cost, named and versioned.

The article: "Estimators drift. Version the estimator. Store est_v2 beside est
so drift is attributable, not mysterious." Every estimator here has a ``name``,
a ``version`` (the string stored in ``job.est_version`` or as a shadow
estimate's version) and ``estimate(*args, **kwargs) -> int``. By convention the
stage is passed as the keyword ``stage=``; estimators that do not need it
ignore it.

Built-ins:

* :class:`Constant` -- a fixed number per stage.
* :class:`TextLength` -- characters / 4 plus the expected output.
* :class:`Tiktoken` -- exact prompt tokens, only where tiktoken and its
  encoding are available locally (no downloads).
* :func:`calibrated` -- any estimator times a per-stage factor learned from
  recently settled jobs; its version changes whenever a factor does.
* :func:`learned` -- exact input tokens (:mod:`.tokens`: bpe-openai, offline)
  plus a per-stage output allowance learned from settled jobs, its state
  shared through the ledger; :func:`refit` refits it there.

Example:
    >>> base = Constant({"draft": 1000})
    >>> base.estimate(stage="draft")
    1000
    >>> cal = calibrated(base)
    >>> cal.version
    'calibrated(const-v1)#00000000'
    >>> submit_kwargs(cal, [base], stage="draft")["shadows"]
    {'const-v1': 1000}
"""

from .basic import Constant, Estimator, TextLength, Tiktoken, at_least_one, load_local_encoding
from .calibrated import Calibrated, base_samples, calibrated, submit_kwargs
from .learned import Estimate, Learned, OutputLearner, RefitResult, StageFit, learned, refit, refit_all
from .tokens import TokenCounter, count_message_tokens, count_tokens, encoding_for_model

__all__ = [
    "Calibrated",
    "Constant",
    "Estimate",
    "Estimator",
    "Learned",
    "OutputLearner",
    "RefitResult",
    "StageFit",
    "TextLength",
    "Tiktoken",
    "TokenCounter",
    "at_least_one",
    "base_samples",
    "calibrated",
    "count_message_tokens",
    "count_tokens",
    "encoding_for_model",
    "learned",
    "load_local_encoding",
    "refit",
    "refit_all",
    "submit_kwargs",
]
