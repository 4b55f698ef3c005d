"""Checks on values that come from callers: each failure names the field and the value.

Every public entry point of the ledger runs its arguments through these before
any transaction starts, so bad input writes nothing.
"""

from __future__ import annotations

import math

from .errors import InvalidInput
from .lanes import MAX_TOKENS

MAX_TEXT = 200  # stage, est_version and run keys are short labels, not documents


def text(field: str, value, *, required: bool = True, limit: int = MAX_TEXT) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        raise InvalidInput(field, value, "expected a non-empty string")
    if len(value) > limit:
        raise InvalidInput(field, value, f"longer than {limit} characters ({len(value)})")
    if "\x00" in value:
        raise InvalidInput(field, value, "contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(field, value, "is not valid unicode text") from None
    return value


def tokens(field: str, value, *, low: int = 1) -> int:
    """A token count: a whole number from ``low`` to 10**12, or InvalidInput naming the field."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        else:
            raise InvalidInput(field, value, "expected a whole number of tokens")
    if value < low:
        raise InvalidInput(field, value, f"expected at least {low}")
    if value > MAX_TOKENS:
        raise InvalidInput(field, value, f"absurdly large (more than {MAX_TOKENS:,} tokens)")
    return value


def when(field: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(field, value, "expected epoch seconds")
    return float(value)
