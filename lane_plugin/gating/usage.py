"""Token usage read from whatever an LLM call returned.

No SDK is imported: responses are read by shape, so any client works.

Shapes understood, in order:

* an ``int`` (tokens already counted);
* a mapping with a ``usage`` entry, or a mapping that *is* a usage block;
* an object with a ``usage`` attribute (OpenAI, LiteLLM, Anthropic responses);

and a usage block is read as ``total_tokens`` (OpenAI chat and responses,
LiteLLM), else ``prompt_tokens + completion_tokens`` (OpenAI, older
LiteLLM), else ``input_tokens + output_tokens`` (Anthropic, OpenAI Responses).

Example:
    >>> extract_usage({"usage": {"prompt_tokens": 12, "completion_tokens": 30}})
    42
    >>> extract_usage("just a string") is None
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import InvalidInput

MISSING_POLICIES = ("estimate", "fail")
_PAIRS = (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens"))


def _field(block: Any, name: str) -> Any:
    if isinstance(block, Mapping):
        return block.get(name)
    return getattr(block, name, None)


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and math.isfinite(value) and value >= 0 and value.is_integer():
        return int(value)
    return None


def _from_block(block: Any) -> int | None:
    total = _count(_field(block, "total_tokens"))
    if total is not None:
        return total
    for a, b in _PAIRS:
        x, y = _count(_field(block, a)), _count(_field(block, b))
        if x is not None or y is not None:
            return (x or 0) + (y or 0)
    return None


def extract_usage(obj: Any) -> int | None:
    """Tokens an LLM call spent, read from its response; None when none can be found.

    Args:
        obj: an int, a dict (with or without a ``usage`` entry), or a response
            object with a ``usage`` attribute.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> extract_usage(NS(usage=NS(input_tokens=100, output_tokens=20)))
        120
    """
    direct = _count(obj)
    if direct is not None or isinstance(obj, (int, float)):
        return direct
    if obj is None or isinstance(obj, (str, bytes)):
        return None
    usage = _field(obj, "usage")
    if usage is not None:
        found = _count(usage)
        return found if found is not None else _from_block(usage)
    if isinstance(obj, Mapping):
        return _from_block(obj)
    return None


def usage_of(obj: Any, reader: Callable[[Any], Any] | None = None) -> int | None:
    """Usage of ``obj`` read by ``reader`` (the ``usage=`` option) or by :func:`extract_usage`.

    A reader may return an int, a response-shaped object, or None (no usage).

    Example:
        >>> usage_of({"n": 7}, lambda r: r["n"])
        7
    """
    if reader is None:
        return extract_usage(obj)
    found = reader(obj)
    if found is None:
        return None
    count = extract_usage(found)
    if count is None:
        raise InvalidInput("usage", found, "the usage= callable must return a token count (int >= 0) or None")
    return count


def check_missing_policy(value: str) -> str:
    """Validate ``missing_usage``: ``estimate`` (bill the estimate, warn) or ``fail``."""
    if value not in MISSING_POLICIES:
        raise InvalidInput("missing_usage", value, f"expected one of {', '.join(MISSING_POLICIES)}")
    return value


__all__ = ["MISSING_POLICIES", "check_missing_policy", "extract_usage", "usage_of"]
