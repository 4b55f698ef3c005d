"""Token usage read from whatever an LLM call returned: responses, stream chunks and stream events.

No SDK is imported: responses are read by shape, so any client works.

Shapes understood, in order:

* an ``int`` (tokens already counted);
* a mapping with a ``usage`` entry, or a mapping that *is* a usage block;
* an object with a ``usage`` attribute (OpenAI, LiteLLM, Anthropic responses);

and a usage block is read as ``total_tokens`` (OpenAI chat and responses,
LiteLLM), else ``prompt_tokens + completion_tokens`` (OpenAI, older
LiteLLM), else ``input_tokens + output_tokens`` plus Anthropic's prompt-cache
fields, weighted as billed (:data:`ANTHROPIC_WEIGHTS`).

**OpenAI's token details are already inside its totals**: ``prompt_tokens``
includes ``prompt_tokens_details.cached_tokens`` (and ``cache_write_tokens``,
``audio_tokens``), ``completion_tokens`` includes
``completion_tokens_details.reasoning_tokens`` (and accepted / rejected
prediction tokens), and ``total_tokens`` is their sum; the Responses API's
``input_tokens_details`` / ``output_tokens_details`` likewise. They are read
once, through the totals, never added again. Cached input tokens count at full
weight, as they do against OpenAI's token limits.

**Anthropic's** ``input_tokens`` excludes prompt-cache tokens, which are billed
beside it: ``cache_creation_input_tokens`` (writes) and
``cache_read_input_tokens`` (hits) are added with the weights of
:data:`ANTHROPIC_WEIGHTS` (Anthropic's price of each relative to a plain input
token). Pass ``usage=weighted_usage(cache_read_input_tokens=1.0)`` to count
them otherwise.

**Streams.** An OpenAI stream sends its usage in a final chunk (with
``stream_options={"include_usage": True}``); an Anthropic stream sends it in
``message_start`` and, cumulatively, in ``message_delta`` events; a Responses
stream in ``response.completed``. :class:`~lane_plugin.gating.usage_meter.UsageMeter` adds such chunks up per
stream (the newest cumulative figure of each), so reporting every chunk of a
stream, or the same chunk twice, never counts twice.

**One rule for every count** (a reported int, a usage field, a ``usage=`` result, a stream's figure):
an int of any kind (``int``, numpy's integers, an integral ``Decimal`` or float such as ``60.0``) is
tokens (:func:`lane_plugin.checks.tokens`); anything else (a bool, NaN, ``50.7``, a negative number, a
string, more than 10**12, or a report that would take the block's total past 10**12) is *refused where it
is given*: not counted, one warning naming the field and the value, and what was counted before it
stays. A usage block with one refused field is refused whole (never the sum of the fields left). The gate
then knows its count is short and bills at least its estimate, marked ``by_estimate``.

Example:
    >>> extract_usage({"usage": {"prompt_tokens": 12, "completion_tokens": 30}})
    42
    >>> extract_usage({"usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 1000}})
    115
    >>> extract_usage("just a string") is None
    True
    >>> extract_usage({"usage": {"prompt_tokens": -5, "completion_tokens": 20}}) is None   # warns: prompt_tokens -5
    True
    >>> extract_usage(np.int64(60))                                                       # doctest: +SKIP
    60
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..checks import is_number, tokens
from ..errors import InvalidInput

MISSING_POLICIES = ("estimate", "fail")


class _NoUsage:
    """``lane_task(usage=NO_USAGE)``: the task uses no tokens (settles 0, never warns about missing usage)."""

    _instance = None

    def __new__(cls) -> _NoUsage:  # one sentinel, also after unpickling
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self) -> tuple[type[_NoUsage], tuple[()]]:
        return (_NoUsage, ())

    def __repr__(self) -> str:
        return "NO_USAGE"


NO_USAGE = _NoUsage()
_BLOCK_FIELDS = ("total_tokens", "prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")
#: How each Anthropic usage field counts, as Anthropic bills it relative to one plain input token:
#: cache writes 1.25x (5-minute TTL) or 2x (1-hour TTL, when the ``cache_creation`` breakdown says so),
#: cache hits 0.1x. ``input_tokens`` and ``output_tokens`` count once each.
ANTHROPIC_WEIGHTS: dict[str, float] = {
    "input_tokens": 1.0,
    "output_tokens": 1.0,
    "cache_creation_input_tokens": 1.25,
    "cache_read_input_tokens": 0.1,
    "ephemeral_5m_input_tokens": 1.25,
    "ephemeral_1h_input_tokens": 2.0,
}


def _field(block: Any, name: str) -> Any:
    if isinstance(block, Mapping):
        return block.get(name)
    return getattr(block, name, None)


def _field_count(block: Any, name: str) -> int | None:
    """The count in field ``name`` of a usage block: None when absent; a whole number of tokens from 0 to
    10**12, else InvalidInput naming the field and the value (the block is then read as no usage found)."""
    value = _field(block, name)
    return None if value is None else tokens(name, value, low=0)


def warn_malformed(exc: InvalidInput | str, source: str | None = None) -> None:
    """Say that usage was refused: what, from where, and what the gate bills instead (the gate's own logger)."""
    from .ledgers import run_logger

    run_logger().warning("%s", refusal(exc, source))


def refusal(exc: InvalidInput | str, source: str | None = None) -> str:
    """The warning for refused usage, one line.

    Example:
        >>> refusal(InvalidInput("usage", -5, "negative (expected at least 0)"), "report_usage()")
        'lane usage: refused invalid usage -5: negative (expected at least 0) (from report_usage()); not counted: the job bills at least its estimate'
    """
    where = f" (from {source})" if source else ""
    return f"lane usage: refused {exc}{where}; not counted: the job bills at least its estimate"


def _anthropic_cache(block: Any, weights: Mapping[str, float]) -> float:
    """Weighted prompt-cache tokens of an Anthropic usage block (0 when it has none)."""
    total = 0.0
    split = _field(block, "cache_creation")
    parts = [(k, _field_count(split, k)) for k in ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")]
    if split is not None and any(n is not None for _, n in parts):
        total += sum(weights[k] * n for k, n in parts if n is not None)
    else:
        total += weights["cache_creation_input_tokens"] * (_field_count(block, "cache_creation_input_tokens") or 0)
    total += weights["cache_read_input_tokens"] * (_field_count(block, "cache_read_input_tokens") or 0)
    return total


def _from_block(block: Any, weights: Mapping[str, float] = ANTHROPIC_WEIGHTS) -> int | None:
    """A usage block's tokens; every count field is checked, also those the total makes unneeded (none may exceed
    it)."""
    total, prompt, completion, x, y = (_field_count(block, k) for k in _BLOCK_FIELDS)
    cache = _anthropic_cache(block, weights)
    if total is not None:
        # A part above the total that counts it: the block contradicts itself, and the learners would read an
        # output the bill never paid for.
        for name, part in zip(_BLOCK_FIELDS[1:], (prompt, completion, x, y)):
            if part is not None and part > total:
                raise InvalidInput(name, part, f"more than total_tokens {total}, which counts it")
        for a, b, names in (
            (prompt, completion, "prompt_tokens + completion_tokens"),
            (x, y, "input_tokens + output_tokens"),
        ):
            if a is not None and b is not None and a + b > total:
                raise InvalidInput("total_tokens", total, f"less than {names} ({a + b}), which it counts")
        return total
    if prompt is not None or completion is not None:
        return (prompt or 0) + (completion or 0)
    if x is not None or y is not None:
        value = weights["input_tokens"] * (x or 0) + weights["output_tokens"] * (y or 0)
        return math.ceil(value + cache - 1e-9)
    return None


def _read(obj: Any, weights: Mapping[str, float]) -> int | None:
    """:func:`extract_usage` without its warning: InvalidInput names a count that is not a count."""
    if is_number(obj):  # the count itself: one rule for ints of every kind (a bool, NaN, -5, 50.7 refused)
        return tokens("usage", obj, low=0)
    if obj is None or isinstance(obj, (str, bytes)):
        return None
    usage = _field(obj, "usage")
    if usage is not None:
        if is_number(usage):  # ``{"usage": 12}``: the count itself
            return tokens("usage", usage, low=0)
        return _from_block(usage, weights)
    if isinstance(obj, Mapping):
        return _from_block(obj, weights)
    return None


def _block_output(block: Any) -> int | None:
    """The output (generated) tokens a usage block states: ``completion_tokens`` (OpenAI chat), else
    ``output_tokens`` (Anthropic, the Responses API); None when it states neither (a ``total_tokens`` alone)."""
    if block is None or is_number(block):
        return None
    for name in ("completion_tokens", "output_tokens"):
        n = _field_count(block, name)
        if n is not None:
            return n
    return None


def _output_of(obj: Any) -> int | None:
    """:func:`_block_output` of a response, a mapping with ``usage``, or a usage block; None for a bare count."""
    if is_number(obj) or obj is None or isinstance(obj, (str, bytes)):
        return None
    usage = _field(obj, "usage")
    if usage is not None:
        return _block_output(usage)
    return _block_output(obj) if isinstance(obj, Mapping) else None


def extract_usage(obj: Any, weights: Mapping[str, float] | None = None) -> int | None:
    """Tokens an LLM call spent, read from its response; None when none can be found (or a count is refused:
    a bool, NaN, negative, fractional, more than 10**12; said in a warning naming the field and the value).

    Args:
        obj: an int of any kind (numpy's, an integral Decimal or float), a dict (with or without a ``usage`` entry), or a response
            object with a ``usage`` attribute.
        weights: Anthropic field weights instead of :data:`ANTHROPIC_WEIGHTS`.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> extract_usage(NS(usage=NS(input_tokens=100, output_tokens=20)))
        120
    """
    try:
        return _read(obj, ANTHROPIC_WEIGHTS if weights is None else {**ANTHROPIC_WEIGHTS, **weights})
    except InvalidInput as exc:
        warn_malformed(exc)
        return None


def weighted_usage(**weights: float) -> Callable[[Any], int | None]:
    """A ``usage=`` reader that weighs Anthropic's fields otherwise (e.g. cache hits at full price).

    Example:
        >>> read = weighted_usage(cache_read_input_tokens=1.0)
        >>> read({"usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 1000}})
        1015
    """
    for key, value in weights.items():
        if key not in ANTHROPIC_WEIGHTS:
            raise InvalidInput("weight", key, f"expected one of {', '.join(ANTHROPIC_WEIGHTS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
            raise InvalidInput(key, value, "expected a weight of at least 0")
    return lambda obj: extract_usage(obj, weights)


#: What a ``usage=`` callable may return.
READER_RETURNS = "a usage= callable must return a token count (a whole number >= 0), a response with .usage, or None"


def usage_of(
    obj: Any, reader: Callable[[Any], Any] | None = None, malformed: Callable[[InvalidInput], Any] = warn_malformed
) -> int | None:
    """Usage of ``obj`` read by ``reader`` (the ``usage=`` option) or by :func:`extract_usage`.

    A reader may return a count (an int of any kind), a response-shaped object, or None (no usage).
    Anything else, or a count that is not a count, is refused: ``malformed`` is told (by default, a
    warning naming the value) and None returned. An exception the reader raises is not caught here.

    Example:
        >>> usage_of({"n": 7}, lambda r: r["n"])
        7
    """
    if reader is None:
        return extract_usage(obj)
    found = reader(obj)
    if found is None:
        return None
    try:
        count = _read(found, ANTHROPIC_WEIGHTS)
        if count is None:
            raise InvalidInput("usage", found, READER_RETURNS)
    except InvalidInput as exc:
        malformed(exc)
        return None
    return count


def check_missing_policy(value: str) -> str:
    """Validate ``missing_usage``: ``estimate`` (bill the estimate, warn) or ``fail``."""
    if value not in MISSING_POLICIES:
        raise InvalidInput("missing_usage", value, f"expected one of {', '.join(MISSING_POLICIES)}")
    return value


__all__ = [
    "ANTHROPIC_WEIGHTS",
    "MISSING_POLICIES",
    "NO_USAGE",
    "READER_RETURNS",
    "check_missing_policy",
    "extract_usage",
    "refusal",
    "usage_of",
    "weighted_usage",
]
