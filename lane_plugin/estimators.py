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

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from .errors import InvalidInput

MAX_ESTIMATE = 10**12


@runtime_checkable
class Estimator(Protocol):
    """What the gate and the ledger need from an estimator."""

    name: str
    version: str

    def estimate(self, *args, **kwargs) -> int:  # pragma: no cover - protocol
        ...


def _count(field: str, value, *, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(field, value, "expected a whole number of tokens")
    if isinstance(value, float):
        if not value.is_integer():
            raise InvalidInput(field, value, "expected a whole number of tokens")
        value = int(value)
    if value < low or value > MAX_ESTIMATE:
        raise InvalidInput(field, value, f"expected a whole number from {low} to {MAX_ESTIMATE:,}")
    return value


def _label(field: str, value) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 64:
        raise InvalidInput(field, value, "expected a non-empty label of at most 64 characters")
    return value


def _at_least_one(n: float) -> int:
    return max(1, min(MAX_ESTIMATE, int(math.ceil(n))))


class Constant:
    """A fixed estimate per stage, with an optional default for other stages.

    Args:
        per_stage: tokens by stage name.
        default: tokens for a stage not in ``per_stage``; None refuses it.
        version: the version label (change it when you change the numbers).

    Example:
        >>> Constant({"draft": 1200, "review": 300}, default=500).estimate(stage="other")
        500
        >>> Constant({"draft": 1200}).estimate(stage="other")
        Traceback (most recent call last):
        ...
        lane_plugin.errors.InvalidInput: invalid stage 'other': no constant estimate for it (known: draft)
    """

    name = "const"

    def __init__(self, per_stage: Mapping[str, int], *, default: int | None = None, version: str = "v1"):
        if not isinstance(per_stage, Mapping):
            raise InvalidInput("per_stage", per_stage, "expected a mapping of stage to tokens")
        self.per_stage = {_label("stage", s): _count(f"estimate for stage {s!r}", n, low=1) for s, n in per_stage.items()}
        self.default = None if default is None else _count("default", default, low=1)
        self.version = f"{self.name}-{_label('version', version)}"

    def estimate(self, *args, stage: str | None = None, **kwargs) -> int:
        if stage in self.per_stage:
            return self.per_stage[stage]
        if self.default is not None:
            return self.default
        known = ", ".join(sorted(self.per_stage)) or "none"
        raise InvalidInput("stage", stage, f"no constant estimate for it (known: {known})")

    def __repr__(self) -> str:
        return f"Constant({self.per_stage!r}, default={self.default!r}, version={self.version!r})"


class TextLength:
    """Prompt characters / ``chars_per_token`` plus the expected output tokens.

    Args:
        expected_output: output tokens to add, a number or a mapping by stage.
        chars_per_token: characters per token (4 is the usual English rule of thumb).
        version: the version label.

    ``estimate(text, stage=..., expected_output=...)`` accepts a string or a list
    of strings / chat messages (dicts with ``content``); a per-call
    ``expected_output`` (e.g. the request's ``max_tokens``) overrides the default.

    Example:
        >>> TextLength(expected_output=100).estimate("x" * 400)
        200
        >>> TextLength(expected_output={"draft": 800}).estimate([{"content": "hi there"}], stage="draft")
        802
    """

    name = "chars4"

    def __init__(self, expected_output: int | Mapping[str, int] = 0, *, chars_per_token: float = 4.0,
                 version: str = "v1"):  # fmt: skip
        if isinstance(expected_output, Mapping):
            self.expected = {_label("stage", s): _count(f"expected_output for stage {s!r}", n) for s, n in expected_output.items()}
        else:
            self.expected = _count("expected_output", expected_output)
        if isinstance(chars_per_token, bool) or not isinstance(chars_per_token, (int, float)) or not (
            math.isfinite(chars_per_token) and chars_per_token > 0
        ):
            raise InvalidInput("chars_per_token", chars_per_token, "expected a positive number")
        self.chars_per_token = float(chars_per_token)
        self.version = f"{self.name}-{_label('version', version)}"

    def _output(self, stage, override) -> int:
        if override is not None:
            return _count("expected_output", override)
        if isinstance(self.expected, dict):
            return self.expected.get(stage, 0)
        return self.expected

    def estimate(self, text="", *args, stage: str | None = None, expected_output: int | None = None,
                 **kwargs) -> int:  # fmt: skip
        chars = len(_text_of(text))
        return _at_least_one(chars / self.chars_per_token + self._output(stage, expected_output))


def _text_of(value) -> str:
    """The text inside a prompt: a string, a list of strings or chat messages."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return _text_of(value.get("content"))
    if isinstance(value, (list, tuple)):
        return "\n".join(_text_of(v) for v in value)
    raise InvalidInput("text", value, "expected a string, a list of strings or chat messages")


class TiktokenUnavailable(InvalidInput):
    """tiktoken or its encoding is not available on this machine."""


class Tiktoken(TextLength):
    """Exact prompt tokens with a local tiktoken encoding, plus the expected output.

    tiktoken downloads its encodings on first use; this estimator never does.
    It loads the encoding only from ``TIKTOKEN_CACHE_DIR`` (or tiktoken's own
    cache) and raises :class:`TiktokenUnavailable` naming what is missing
    otherwise, so a worker without network access fails at construction, not
    in the middle of a run.

    Example:
        >>> Tiktoken("cl100k_base").estimate("hello world")   # doctest: +SKIP
        2
    """

    name = "tiktoken"

    def __init__(self, encoding: str = "cl100k_base", expected_output: int | Mapping[str, int] = 0, *,
                 version: str = "v1"):  # fmt: skip
        super().__init__(expected_output, version=version)
        self.encoding_name = _label("encoding", encoding)
        self.encoding = load_local_encoding(self.encoding_name)
        self.version = f"{self.name}-{self.encoding_name}-{version}"

    def estimate(self, text="", *args, stage: str | None = None, expected_output: int | None = None,
                 **kwargs) -> int:  # fmt: skip
        n = len(self.encoding.encode(_text_of(text), disallowed_special=()))
        return _at_least_one(n + self._output(stage, expected_output))


def load_local_encoding(name: str):
    """A tiktoken encoding from the local cache, or :class:`TiktokenUnavailable`."""
    try:
        import tiktoken
        import tiktoken.load
    except ImportError:
        raise TiktokenUnavailable("encoding", name, "tiktoken is not installed (pip install tiktoken)") from None
    cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    if cache is None:
        import tempfile

        cache = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if not os.path.isdir(cache) or not os.listdir(cache):
        raise TiktokenUnavailable(
            "encoding", name, f"not in the local tiktoken cache {cache!r} (set TIKTOKEN_CACHE_DIR to a "
            "directory holding the downloaded encoding; this estimator never downloads)"
        )  # fmt: skip
    real = tiktoken.load.read_file

    def no_download(blobpath: str) -> bytes:
        if blobpath.startswith(("http://", "https://")):
            raise TiktokenUnavailable("encoding", name, f"would need a download from {blobpath}")
        return real(blobpath)

    tiktoken.load.read_file = no_download
    try:
        return tiktoken.get_encoding(name)
    except TiktokenUnavailable:
        raise
    except Exception as exc:
        raise TiktokenUnavailable("encoding", name, f"cannot load it locally: {exc}") from None
    finally:
        tiktoken.load.read_file = real


# -- calibration -------------------------------------------------------------------
class Calibrated:
    """``base`` times a per-stage factor learned from settled jobs; see :func:`calibrated`."""

    name = "calibrated"

    def __init__(self, base: Estimator, *, quantile: float = 0.6, window: int = 200, min_jobs: int = 20,
                 step: float = 0.01, factors: Mapping[str, float] | None = None):  # fmt: skip
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
            self.factors[_label("stage", stage)] = self._check_factor(stage, f)

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
        return _at_least_one(self.base.estimate(*args, stage=stage, **kwargs) * self.factor(stage))

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
            ratios = sorted(a / e for e, a in list(pairs)[-self.window:] if e > 0)
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


def base_samples(ledger, version: str, *, lane: str | None = None, window: int = 200) -> dict[str, list[tuple[int, int]]]:
    """``{stage: [(est, actual), ...]}`` of done jobs estimated by ``version``, oldest first.

    Reads the newest ``window`` per stage from the admission estimate and the
    shadow estimates together.
    """
    params = {"v": version}
    where = ""
    if lane:
        where = " and j.lane = :lane"
        params["lane"] = lane
    _, rows = ledger.rows(
        "select j.stage, j.est, j.actual, j.finished_at from job j where j.state = 'done' and j.est_version = :v"
        + where
        + " union all select j.stage, s.est, j.actual, j.finished_at from job j join shadow_estimate s "
        "on s.job_id = j.id where j.state = 'done' and s.version = :v" + where,
        params,
    )
    out: dict[str, list[tuple[float, int, int]]] = {}
    for stage, est, actual, finished in rows:
        out.setdefault(stage, []).append((finished or 0.0, int(est), int(actual)))
    return {s: [(e, a) for _, e, a in sorted(v)[-window:]] for s, v in out.items()}


def submit_kwargs(primary: Estimator, shadows: Iterable[Estimator] = (), *args, **kwargs) -> dict:
    """``est``, ``est_version`` and ``shadows`` for :meth:`Ledger.submit` from estimators.

    Admit with ``primary`` and record every other estimator's number beside it,
    so ``lane report --by stage,version`` compares them on the same jobs.

    Example:
        >>> base = Constant({"draft": 1000})
        >>> submit_kwargs(calibrated(base), [base], stage="draft")
        {'est': 1000, 'est_version': 'calibrated(const-v1)#00000000', 'shadows': {'const-v1': 1000}}
    """
    est = primary.estimate(*args, **kwargs)
    out = {"est": est, "est_version": primary.version, "shadows": {}}
    for other in shadows:
        if other.version != primary.version:
            out["shadows"][other.version] = other.estimate(*args, **kwargs)
    return out


__all__ = [
    "Calibrated", "Constant", "Estimator", "TextLength", "Tiktoken", "TiktokenUnavailable", "base_samples",
    "calibrated", "load_local_encoding", "submit_kwargs",
]  # fmt: skip
