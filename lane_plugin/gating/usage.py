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
stream in ``response.completed``. :class:`UsageMeter` adds such chunks up per
stream (the newest cumulative figure of each), so reporting every chunk of a
stream, or the same chunk twice, never counts twice.

**A count that is not a count** (NaN, negative, fractional, a string, more than 10**12) makes
the whole usage block count as no usage found, with one warning naming the field and the value:
the gate then bills the estimate (marked ``by_estimate``), never the rest of the block.

Example:
    >>> extract_usage({"usage": {"prompt_tokens": 12, "completion_tokens": 30}})
    42
    >>> extract_usage({"usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 1000}})
    115
    >>> extract_usage("just a string") is None
    True
    >>> extract_usage({"usage": {"prompt_tokens": -5, "completion_tokens": 20}}) is None   # warns: prompt_tokens -5
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..checks import tokens
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
_ANTHROPIC_EVENTS = ("message_start", "message_delta", "message_stop", "content_block_start", "content_block_delta",
                     "content_block_stop", "ping", "text", "thinking", "signature", "input_json", "citation")  # fmt: skip


def _field(block: Any, name: str) -> Any:
    if isinstance(block, Mapping):
        return block.get(name)
    return getattr(block, name, None)


def _count(value: Any) -> int | None:
    """A value given as the usage itself (an int): a whole number from 0, else None (no usage)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and math.isfinite(value) and value >= 0 and value.is_integer():
        return int(value)
    return None


def _field_count(block: Any, name: str) -> int | None:
    """The count in field ``name`` of a usage block: None when absent; a whole number of tokens from 0 to
    10**12, else InvalidInput naming the field and the value (the block is then read as no usage found)."""
    value = _field(block, name)
    return None if value is None else tokens(name, value, low=0)


def warn_malformed(exc: InvalidInput) -> None:
    """Say, once per usage block, which count field was not a count (the gate's own logger)."""
    from .ledgers import run_logger

    run_logger().warning("lane usage: %s; this usage counts as no usage found (the gate bills the estimate)", exc)


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
    """A usage block's tokens; every count field is checked, also those the total makes unneeded."""
    total, prompt, completion, x, y = (_field_count(block, k) for k in _BLOCK_FIELDS)
    cache = _anthropic_cache(block, weights)
    if total is not None:
        return total
    if prompt is not None or completion is not None:
        return (prompt or 0) + (completion or 0)
    if x is not None or y is not None:
        value = weights["input_tokens"] * (x or 0) + weights["output_tokens"] * (y or 0)
        return math.ceil(value + cache - 1e-9)
    return None


def _read(obj: Any, weights: Mapping[str, float]) -> int | None:
    """:func:`extract_usage` without its warning: InvalidInput names a count field that is not a count."""
    direct = _count(obj)
    if direct is not None or isinstance(obj, (int, float)):
        return direct
    if obj is None or isinstance(obj, (str, bytes)):
        return None
    usage = _field(obj, "usage")
    if usage is not None:
        if isinstance(usage, (int, float)):  # ``{"usage": 12}``: the count itself
            return tokens("usage", usage, low=0)
        return _from_block(usage, weights)
    if isinstance(obj, Mapping):
        return _from_block(obj, weights)
    return None


def extract_usage(obj: Any, weights: Mapping[str, float] | None = None) -> int | None:
    """Tokens an LLM call spent, read from its response; None when none can be found (or a count field is
    not a count: NaN, negative, fractional, more than 10**12; said in a warning naming the field and the value).

    Args:
        obj: an int, a dict (with or without a ``usage`` entry), or a response
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


class UsageMeter:
    """Adds up usage reported inside one gated block: ints, responses, and stream chunks or events.

    A stream's chunks are kept per stream (an OpenAI chunk's ``id``, an
    Anthropic message, a Responses ``response.id``) at their newest cumulative
    figure, so a usage chunk seen twice, or cumulative usage on every chunk,
    is counted once; so is a response object both reported and returned. Usage with a count that is
    not a count adds nothing, is warned about (once per meter) and sets :attr:`malformed`.

    Example:
        >>> m = UsageMeter()
        >>> m.add({"object": "chat.completion.chunk", "id": "c1", "usage": None})
        False
        >>> m.add({"object": "chat.completion.chunk", "id": "c1", "usage": {"total_tokens": 50}})
        True
        >>> m.add(7), m.total
        (True, 57)
    """

    def __init__(self, weights: Mapping[str, float] | None = None):
        self.weights = ANTHROPIC_WEIGHTS if weights is None else {**ANTHROPIC_WEIGHTS, **weights}
        self.found = False
        self.malformed = False  # some usage had a count field that is not a count: what was found is not all
        self._plain = 0
        self._streams: dict[Any, int] = {}
        self._message: dict[str, Any] | None = None  # the Anthropic message being streamed: its usage fields so far
        self._message_key: Any = None
        self._seq = 0
        self._seen: dict[int, Any] = {}

    @property
    def total(self) -> int:
        return self._plain + sum(self._streams.values())

    def add(self, obj: Any) -> bool:
        """Count ``obj``; True if it carried usage, False for a stream chunk or event without any.

        Raises :class:`~lane_plugin.errors.InvalidInput` for something that is
        neither usage nor part of a stream (a string, a result with no usage).
        """
        try:
            took = self._take(obj)
        except InvalidInput as exc:  # a count field that is not a count: this usage is not read at all
            self.bad(exc)
            return False
        if took is None:
            raise InvalidInput("usage", obj, "no token count found (expected an int or a response with .usage)")
        return took

    def bad(self, exc: InvalidInput) -> None:
        """Usage with a count field that is not a count was seen: warned (once per meter), :attr:`malformed` set."""
        if not self.malformed:
            warn_malformed(exc)
        self.malformed = True

    def _take(self, obj: Any) -> bool | None:
        """:meth:`add`, None for what is not usage; InvalidInput from a count field that is not a count."""
        kind = _field(obj, "type") if not isinstance(obj, (int, float, str, bytes)) else None
        if isinstance(kind, str) and kind in _ANTHROPIC_EVENTS:
            return self._anthropic_event(kind, obj)
        if isinstance(kind, str) and kind.startswith("response."):  # the Responses API's stream events
            resp = _field(obj, "response")
            n = None if resp is None else _read(resp, self.weights)
            if n is None:
                return False
            self._streams[("response", _field(resp, "id"))] = n
            self.found = True
            return True
        if _field(obj, "object") == "chat.completion.chunk":
            if _field(obj, "usage") is None:
                return False
            n = _read(obj, self.weights)
            if n is None:
                return False
            self._streams[("chunk", _field(obj, "id"))] = n
            self.found = True
            return True
        n = _read(obj, self.weights)
        if n is None:
            if not isinstance(obj, (str, bytes)) and _has_usage_slot(obj):
                return False  # a response or chunk whose usage is None: nothing to add
            return None
        if not isinstance(obj, (int, float)):
            if self._seen.get(id(obj)) is obj:
                return True  # the same response reported and returned: counted once
            self._seen[id(obj)] = obj
        self._plain += n
        self.found = True
        return True

    def _anthropic_event(self, kind: str, obj: Any) -> bool:
        if kind == "message_start":
            message = _field(obj, "message")
            usage = _field(message, "usage")
            self._seq += 1
            self._message_key = ("message", _field(message, "id") or self._seq)
            self._message = {}
            self._merge(self._message, usage)
        elif kind == "message_delta":
            if self._message is None:  # a delta without its start: count what it says
                self._seq += 1
                self._message_key, self._message = ("message", self._seq), {}
            self._merge(self._message, _field(obj, "usage"))
        else:
            return False
        self._streams[self._message_key] = _from_block(self._message, self.weights) or 0
        self.found = True
        return True

    def _merge(self, message: dict[str, Any], usage: Any) -> None:
        """Take the non-null fields of an Anthropic usage block into ``message`` (deltas are cumulative)."""
        if usage is None:
            return
        for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            value = _field_count(usage, key)
            if value is not None:
                message[key] = value
        split = _field(usage, "cache_creation")
        if split is not None:
            message["cache_creation"] = {k: _field_count(split, k) for k in
                                         ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")}  # fmt: skip


def _has_usage_slot(obj: Any) -> bool:
    if isinstance(obj, Mapping):
        return "usage" in obj
    return hasattr(obj, "usage")


def usage_of(obj: Any, reader: Callable[[Any], Any] | None = None,
             malformed: Callable[[InvalidInput], Any] = warn_malformed) -> int | None:  # fmt: skip
    """Usage of ``obj`` read by ``reader`` (the ``usage=`` option) or by :func:`extract_usage`.

    A reader may return an int, a response-shaped object, or None (no usage). What it returns with a
    count field that is not a count is no usage found: ``malformed`` is told (by default, a warning).

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
    except InvalidInput as exc:
        malformed(exc)
        return None
    if count is None:
        raise InvalidInput("usage", found, "the usage= callable must return a token count (int >= 0) or None")
    return count


def check_missing_policy(value: str) -> str:
    """Validate ``missing_usage``: ``estimate`` (bill the estimate, warn) or ``fail``."""
    if value not in MISSING_POLICIES:
        raise InvalidInput("missing_usage", value, f"expected one of {', '.join(MISSING_POLICIES)}")
    return value


__all__ = [
    "ANTHROPIC_WEIGHTS", "MISSING_POLICIES", "NO_USAGE", "UsageMeter", "check_missing_policy", "extract_usage", "usage_of",
    "weighted_usage",
]  # fmt: skip
