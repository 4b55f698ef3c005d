"""Estimators that need no history: a constant per stage, and prompt length plus expected output.

Every estimator has a ``name``, a ``version`` (the string stored in
``job.est_version`` or as a shadow estimate's version) and
``estimate(*args, **kwargs) -> int``. By convention the stage is passed as the
keyword ``stage=``; estimators that do not need it ignore it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from ..checks import MAX_TOKENS, label, tokens
from ..errors import InvalidInput, TiktokenUnavailable


@runtime_checkable
class Estimator(Protocol):
    """What the gate and the ledger need from an estimator."""

    name: str
    version: str

    def estimate(self, *args, **kwargs) -> int:  # pragma: no cover - protocol
        ...


def at_least_one(n: float) -> int:
    """A token estimate from a float: rounded up, from 1 to 10**12."""
    return max(1, min(MAX_TOKENS, int(math.ceil(n))))


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
        self.per_stage = {label("stage", s): tokens(f"estimate for stage {s!r}", n) for s, n in per_stage.items()}
        self.default = None if default is None else tokens("default", default)
        self.version = f"{self.name}-{label('version', version)}"

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

    def __init__(
        self, expected_output: int | Mapping[str, int] = 0, *, chars_per_token: float = 4.0, version: str = "v1"
    ):
        if isinstance(expected_output, Mapping):
            self.expected = {
                label("stage", s): tokens(f"expected_output for stage {s!r}", n, low=0)
                for s, n in expected_output.items()
            }
        else:
            self.expected = tokens("expected_output", expected_output, low=0)
        if (
            isinstance(chars_per_token, bool)
            or not isinstance(chars_per_token, (int, float))
            or not (math.isfinite(chars_per_token) and chars_per_token > 0)
        ):
            raise InvalidInput("chars_per_token", chars_per_token, "expected a positive number")
        self.chars_per_token = float(chars_per_token)
        self.version = f"{self.name}-{label('version', version)}"

    def _output(self, stage, override) -> int:
        if override is not None:
            return tokens("expected_output", override, low=0)
        if isinstance(self.expected, dict):
            return self.expected.get(stage, 0)
        return self.expected

    def estimate(self, text="", *args, stage: str | None = None, expected_output: int | None = None, **kwargs) -> int:
        chars = len(_text_of(text))
        return at_least_one(chars / self.chars_per_token + self._output(stage, expected_output))


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

    def __init__(
        self, encoding: str = "cl100k_base", expected_output: int | Mapping[str, int] = 0, *, version: str = "v1"
    ):
        super().__init__(expected_output, version=version)
        self.encoding_name = label("encoding", encoding)
        self.encoding = load_local_encoding(self.encoding_name)
        self.version = f"{self.name}-{self.encoding_name}-{version}"

    def estimate(self, text="", *args, stage: str | None = None, expected_output: int | None = None, **kwargs) -> int:
        n = len(self.encoding.encode(_text_of(text), disallowed_special=()))
        return at_least_one(n + self._output(stage, expected_output))


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
            "encoding",
            name,
            f"not in the local tiktoken cache {cache!r} (set TIKTOKEN_CACHE_DIR to a "
            "directory holding the downloaded encoding; this estimator never downloads)",
        )
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
