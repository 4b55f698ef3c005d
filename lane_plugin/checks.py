"""Checks on values that come from callers: each failure names the field and the value.

Every entry point (the ledger's API, the gate, the estimators, the simulator's
traffic and the CLI) runs its arguments through these before any work starts,
so bad input writes nothing and an estimate is checked once on its way in.
"""

from __future__ import annotations

import math
import numbers
from decimal import Decimal
from typing import Literal, overload

from .errors import InvalidInput

MAX_TOKENS = 10**12
MAX_TEXT = 200  # stage, est_version and run keys are short labels, not documents
SHADOW_VERSION_MAX = 128  # the shadow_estimate.version column (a primary key: kept short)


@overload
def text(field: str, value: object, *, required: Literal[True] = True, limit: int = MAX_TEXT) -> str: ...
@overload
def text(field: str, value: object, *, required: bool, limit: int = MAX_TEXT) -> str | None: ...
def text(field: str, value: object, *, required: bool = True, limit: int = MAX_TEXT) -> str | None:
    """A non-empty label of at most ``limit`` characters (None allowed when not ``required``)."""
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


def new_lane_name(value: str) -> str:
    """A name for a lane being created: a lane label of at most 64 characters, no spaces or control characters.

    Lanes are named on command lines and in Prefect tags (``lane:NAME``), where a space splits the name.
    Lanes that already exist keep whatever name they have.

    Example:
        >>> new_lane_name("batch-2")
        'batch-2'
    """
    value = text("lane", value, limit=64)
    bad = next((ch for ch in value if ch.isspace() or not ch.isprintable()), None)
    if bad is not None:
        raise InvalidInput("lane", value, f"a new lane's name may not contain {bad!r}: use letters, digits, - _ . :")
    return value


def tenant_name(value: object) -> str:
    """A tenant's name: a label of at most 64 characters with no control characters (a tab or a newline would
    break the tables and status lines that show it); spaces are fine (a flow's name may have them).

    Example:
        >>> tenant_name("search team")
        'search team'
    """
    value = text("tenant", value, limit=64)
    bad = next((ch for ch in value if not ch.isprintable() and ch != " "), None)
    if bad is not None:
        raise InvalidInput("tenant", value, f"a tenant's name may not contain the control character {bad!r}")
    return value


def is_number(value) -> bool:
    """Is ``value`` a number of some kind (so, as a count, one to check rather than to read as a response)?

    Python's and numpy's numbers, ``Decimal`` and ``Fraction``, and bools (numpy's too), which are then
    refused as counts.

    Example:
        >>> is_number(Decimal("7")), is_number(True), is_number("7")
        (True, True, False)
    """
    return isinstance(value, (numbers.Number, bool)) or _is_numpy_bool(value)


def _is_numpy_bool(value) -> bool:
    return getattr(getattr(value, "dtype", None), "kind", None) == "b" and not hasattr(value, "__len__")


def _whole_number(value) -> int | None:
    """``value`` as an int if it is a whole number (an int, numpy's integers, a float such as 12.0, an integral
    ``Decimal`` or ``Fraction``), else None.

    A bool is not a count. numpy's and pandas' integers come from a DataFrame of usage: they are counts.
    """
    if isinstance(value, bool) or _is_numpy_bool(value):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, Decimal):
        if not value.is_finite() or value != value.to_integral_value():
            return None
        if value.adjusted() >= 30:  # far past any bound: say so without building a number of a billion digits
            return MAX_TOKENS * 10**18 * (1 if value > 0 else -1)
        return int(value)
    if isinstance(value, numbers.Real):
        try:
            if math.isfinite(value) and value == math.floor(value):
                return int(value)
        except (OverflowError, ValueError, TypeError):
            return None
    return None


def _not_whole(value) -> str:
    """Why ``value`` is not a whole number, in a few words."""
    if isinstance(value, bool) or _is_numpy_bool(value):
        return "a bool is not a count of tokens"
    if isinstance(value, Decimal):
        return "not a finite number" if not value.is_finite() else "not a whole number of tokens"
    if isinstance(value, numbers.Real):
        try:
            return "not a whole number of tokens" if math.isfinite(value) else "not a finite number"
        except (OverflowError, ValueError, TypeError):
            return "not a finite number"
    return "expected a whole number of tokens"


def tokens(field: str, value, *, low: int = 1) -> int:
    """A token count: a whole number from ``low`` to 10**12, or InvalidInput naming the field and the value.

    The one rule for every count the library is given (estimates, rate costs, usage, actuals): an int of any
    kind (``int``, numpy's integers, an integral ``Decimal``, ``Fraction`` or float such as 12.0) is a count;
    a bool, NaN, a fraction of a token, a negative number or more than :data:`MAX_TOKENS` is not, and the
    message says which.

    Example:
        >>> tokens("est", 12.0)
        12
        >>> tokens("usage", Decimal("60"), low=0)
        60
        >>> tokens("usage", -5, low=0)
        Traceback (most recent call last):
        lane_plugin.errors.InvalidInput: invalid usage -5: negative (expected at least 0)
    """
    whole_value = _whole_number(value)
    if whole_value is None:
        raise InvalidInput(field, value, _not_whole(value))
    if whole_value < 0 <= low:
        raise InvalidInput(field, value, f"negative (expected at least {low})")
    if whole_value < low:
        raise InvalidInput(field, value, f"expected at least {low}")
    if whole_value > MAX_TOKENS:
        raise InvalidInput(field, value, f"absurdly large (more than {MAX_TOKENS:,} tokens)")
    return whole_value


def whole(field: str, value, *, low: int) -> int:
    """A whole number from ``low`` to 10**12 (lane settings: ceilings, slots, attempts)."""
    whole_value = _whole_number(value)
    if whole_value is None:
        raise InvalidInput(field, value, "expected a whole number")
    value = whole_value
    if value < low or value > MAX_TOKENS:
        raise InvalidInput(field, value, f"expected a whole number from {low} to {MAX_TOKENS:,}")
    return value


def number(field: str, value, *, low: float, high: float, low_open: bool = False) -> float:
    """A finite number in ``[low, high]`` (``(low, high]`` when ``low_open``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(field, value, "expected a number")
    value = float(value)
    if value != value or value > high or value < low or (low_open and value == low):
        bound = f"above {low:g}" if low_open else f"at least {low:g}"
        raise InvalidInput(field, value, f"expected a number {bound} and at most {high:g}")
    return value


def when(field: str, value) -> float | None:
    """Epoch seconds (or None)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(field, value, "expected epoch seconds")
    return float(value)


def label(field: str, value, *, limit: int = 64) -> str:
    """A short name (a stage in an estimator's table, a version label)."""
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise InvalidInput(field, value, f"expected a non-empty label of at most {limit} characters")
    return text(field, value, limit=limit)  # and no NUL, no lone surrogate (a driver's traceback otherwise)


def job_ref(field: str, value, attempt: int | None = None) -> tuple[str, int | None]:
    """A job id, or ``ID:ATTEMPT`` (what ``lane tick`` and ``lane submit`` print); returns ``(id, attempt)``.

    An attempt given both ways must agree.

    Example:
        >>> job_ref("job id", "4f2a:2")
        ('4f2a', 2)
    """
    value = text(field, value)
    if ":" in value:
        value, _, suffix = value.rpartition(":")
        if not suffix.isdigit() or not value:
            raise InvalidInput(field, f"{value}:{suffix}", "expected ID or ID:ATTEMPT (a whole number from 1)")
        ref = tokens("attempt", int(suffix))
        if attempt is not None and attempt != ref:
            raise InvalidInput("attempt", attempt, f"the job reference says attempt {ref}")
        attempt = ref
    return value, attempt
