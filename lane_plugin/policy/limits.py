"""A lane's limits as its provider states them: sliding windows over requests and tokens (rule 6b); pure.

A provider states several limits at once (OpenAI: requests and tokens per minute; Anthropic:
requests, input tokens and output tokens per minute). A lane holds one sliding window per
:data:`UNITS` unit it limits, each ``amount`` per ``window_seconds``:

- ``requests``: every admission counts 1;
- ``tokens``: the job's rate cost (``rate_cost``, else its estimate): the burst window of rule 6,
  stored as the lane's ``burst_tokens`` / ``window_seconds``;
- ``input_tokens``: the job's input (prompt) tokens;
- ``output_tokens``: the job's output allowance at request time (trued up to what was generated at
  settlement, as ``rate_basis = 'actual'`` trues up ``tokens``).

Rule 6b, the statement: for every limit ``(unit, amount, window)`` the units admitted in
``(now - window, now]`` plus the job's units stay ``<= amount``. The proof is rule 6's: checked at
every admission, the count of any span of ``window`` seconds is largest when it ends at an
admission (counts only grow at admissions), and that admission counted exactly that span, so no
span of ``window`` seconds ever holds more than ``amount`` units, for each limit on its own. A job
whose units exceed a limit's ``amount`` can never pass it (no window is emptier than empty): it is
refused at intake (:func:`never_passes`).

``output_tokens`` is the exception to "counts only grow at admissions": its charge is the job's output
allowance from the admission, and at settlement it becomes what the call generated, counted from then
(:func:`lane_plugin.ledger.limits.true_up_output`), so a call that generated more than its allowance
grows the window after the fact, and the window may hold more than ``amount``: what holds is the
statement at every admission, on the counts the lane has then. Against a provider that counts output
as it is generated (issue 24's model of Anthropic's OTPM; Anthropic documents an estimate from
``max_tokens`` at arrival, adjusted at the end) the lane's count is not below the provider's but for a
call that generated more than its allowance, until its answer settles, and a settlement that does not
state its output (read as ``actual`` less the job's input, which cache reads billed at a tenth of the
input understate). The allowance kept free at each admission is a margin against those, not a bound: an
undercount larger than one allowance (several calls over theirs at once) can meet a 429, which pauses
the lane (rule 1b); ``track_limits`` trues the window up to the provider's own count.

Example:
    >>> lim = parse_limit("requests=500/60s")
    >>> lim, format_limit(lim)
    (('requests', Limit(amount=500, window_seconds=60.0)), 'requests 500/60s')
    >>> blocking_limit((LimitUse("requests", Limit(2, 10.0), used=2),), {"requests": 1})
    'requests'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

REQUESTS, TOKENS, INPUT_TOKENS, OUTPUT_TOKENS = "requests", "tokens", "input_tokens", "output_tokens"
UNITS = (REQUESTS, TOKENS, INPUT_TOKENS, OUTPUT_TOKENS)
# Units with a window of their own (tokens is the lane's burst window: burst_tokens / window_seconds).
EXTRA_UNITS = (REQUESTS, INPUT_TOKENS, OUTPUT_TOKENS)
# burst_tokens of a lane whose tokens limit is dropped (--limit tokens=none): no job's rate cost reaches it.
NO_TOKENS_LIMIT = 2**53
_AMOUNT = re.compile(r"^[+-]?\d[\d_]*$", re.ASCII)  # ASCII digits: a stored spec reads back alike
# a number (an exponent too: a stored spec holds a float's repr) and a unit; a bare unit means 1 of it
_WINDOW = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)?\s*(ms|s|m|min|h|d)?$", re.ASCII)
# the bounds of a limit, as the lane's own settings have them (burst_tokens, window_seconds)
MAX_AMOUNT = 10**12
MIN_WINDOW, MAX_WINDOW = 0.001, 365 * 86_400.0  # a millisecond (the smallest unit the syntax names), a year
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86_400.0}


@dataclass(frozen=True)
class Limit:
    """``amount`` units per sliding ``window_seconds``."""

    amount: int
    window_seconds: float


@dataclass(frozen=True)
class LimitUse:
    """One limit of a lane at one instant: ``used`` units admitted in its window (pending ones included)."""

    unit: str
    limit: Limit
    used: int = 0


class LimitSyntaxError(ValueError):
    """A ``--limit`` value that does not read as ``UNIT=AMOUNT/WINDOW`` or ``UNIT=none``.

    ``spec``: the value as given; ``why``: what is wrong with it (the message is ``limit SPEC: WHY``).
    """

    def __init__(self, spec: str, why: str) -> None:
        super().__init__(f"limit {spec!r}: {why}")
        self.spec, self.why = spec, why


def parse_limit(text: str) -> tuple[str, Limit | None]:
    """``"requests=500/60s"`` -> ``("requests", Limit(500, 60.0))``; ``"requests=none"`` -> ``("requests", None)``.

    The window is a number and a unit (``ms``, ``s``, ``m``/``min``, ``h``, ``d``; a bare unit means 1 of
    it: ``500/m``); the amount a positive integer (``30_000`` allowed).

    Raises:
        LimitSyntaxError: naming the value and what was expected.

    Example:
        >>> parse_limit("tokens=30000/m"), parse_limit("output_tokens=none")
        (('tokens', Limit(amount=30000, window_seconds=60.0)), ('output_tokens', None))
        >>> parse_limit("rpm=5/1s")
        Traceback (most recent call last):
        ...
        lane_plugin.policy.limits.LimitSyntaxError: limit 'rpm=5/1s': unknown unit 'rpm' (expected one of ...)
    """
    unit, sep, spec = text.partition("=")
    unit = unit.strip()
    if not sep:
        raise LimitSyntaxError(text, "expected UNIT=AMOUNT/WINDOW (e.g. requests=500/60s) or UNIT=none")
    if unit not in UNITS:
        raise LimitSyntaxError(text, f"unknown unit {unit!r} (expected one of {', '.join(UNITS)})")
    if spec.strip().lower() == "none":
        return unit, None
    amount_text, slash, window_text = (part.strip() for part in spec.partition("/"))
    if not slash or not amount_text or not window_text:
        raise LimitSyntaxError(text, "expected AMOUNT/WINDOW after '=', e.g. 500/60s, 30000/1m or 8000/m (or none)")
    if not _AMOUNT.match(amount_text):
        raise LimitSyntaxError(text, f"the amount {amount_text!r} is not a whole number (e.g. 500)")
    m = _WINDOW.match(window_text)
    if m is None or (m.group(1) is None and m.group(2) is None):
        raise LimitSyntaxError(text, f"the window {window_text!r} is not a number of ms, s, m, h or d (e.g. 60s)")
    lim = Limit(int(amount_text.replace("_", "")), float(m.group(1) or 1) * _SECONDS[m.group(2) or "s"])
    why = limit_problem(lim)
    if why is not None:
        raise LimitSyntaxError(text, why)
    return unit, lim


def limit_problem(lim: Limit) -> str | None:
    """What is wrong with ``lim`` (None: nothing): an amount that is not a whole number from 1 to
    :data:`MAX_AMOUNT`, a window that is not a number of seconds from :data:`MIN_WINDOW` to :data:`MAX_WINDOW`.

    Example:
        >>> limit_problem(Limit(500, 60.0)), limit_problem(Limit(500, 0.0))
        (None, 'the window must be longer than 0 seconds')
    """
    amount, window = lim.amount, lim.window_seconds
    if isinstance(amount, bool) or not isinstance(amount, int):
        return f"the amount must be a whole number, got {amount!r}"
    if amount <= 0:
        return f"the amount must be a positive integer, got {amount}"
    if amount > MAX_AMOUNT:
        return f"the amount must be at most {MAX_AMOUNT:,}, got {amount:,}"
    if isinstance(window, bool) or not isinstance(window, (int, float)) or window != window:
        return f"the window must be a number of seconds, got {window!r}"
    if window <= 0:
        return "the window must be longer than 0 seconds"
    if window < MIN_WINDOW or window > MAX_WINDOW:
        return f"the window must be from 1ms to a year ({MAX_WINDOW:,.0f}s), got {window:g}s"
    return None


def format_limit(limit: tuple[str, Limit]) -> str:
    """``("requests", Limit(500, 60.0))`` -> ``"requests 500/60s"`` (how ``lane lanes`` and ``lane status`` say it)."""
    unit, lim = limit
    return f"{unit} {lim.amount}/{lim.window_seconds:g}s"


def spec_of(limits: Iterable[tuple[str, Limit]]) -> str | None:
    """The lane row's ``limit_spec`` text of ``limits`` (None: none), in :data:`UNITS` order; read by :func:`limits_of_spec`.

    Example:
        >>> spec_of([("output_tokens", Limit(8000, 60.0)), ("requests", Limit(500, 60.0))])
        'requests=500/60.0s output_tokens=8000/60.0s'
        >>> limits_of_spec(_) == (("requests", Limit(500, 60.0)), ("output_tokens", Limit(8000, 60.0)))
        True
    """
    by_unit = dict(limits)
    parts = [f"{u}={by_unit[u].amount}/{by_unit[u].window_seconds!r}s" for u in UNITS if u in by_unit]
    return " ".join(parts) or None


def limits_of_spec(spec: str | None) -> tuple[tuple[str, Limit], ...]:
    """The limits a ``limit_spec`` states (:func:`spec_of`), in :data:`UNITS` order."""
    if not spec:
        return ()
    out = []
    for part in spec.split():
        unit, lim = parse_limit(part)
        if lim is not None:
            out.append((unit, lim))
    return tuple(out)


def units_of(rate: int, input_tokens: int | None, output_tokens: int | None) -> dict[str, int]:
    """What one request counts against each unit.

    ``rate`` is the job's rate cost (``tokens``). A job whose input/output split is unknown counts its
    whole rate cost against both (cautious: no split could count more against either).

    Example:
        >>> units_of(900, 600, 300), units_of(900, None, None)["output_tokens"]
        ({'requests': 1, 'tokens': 900, 'input_tokens': 600, 'output_tokens': 300}, 900)
    """
    return {
        REQUESTS: 1,
        TOKENS: rate,
        INPUT_TOKENS: rate if input_tokens is None else input_tokens,
        OUTPUT_TOKENS: rate if output_tokens is None else output_tokens,
    }


def blocking_limit(
    limits: Iterable[LimitUse], units: Mapping[str, int], held: Mapping[str, int] | None = None
) -> str | None:
    """The unit of the first limit the job's ``units`` would overfill (rule 6b), or None.

    ``held``: units a shadow reservation keeps in the windows (rule 8) on top of what they hold.
    """
    for use in limits:
        extra = held.get(use.unit, 0) if held else 0
        if use.used + extra + units.get(use.unit, 0) > use.limit.amount:
            return use.unit
    return None


def never_passes(limits: Iterable[tuple[str, Limit]], units: Mapping[str, int]) -> str | None:
    """Why a job can never pass one of ``limits`` (its units alone exceed the amount), or None (rule 10).

    Example:
        >>> never_passes([("output_tokens", Limit(8000, 60.0))], {"output_tokens": 9000})
        'output_tokens 9000 exceeds the limit output_tokens 8000/60s'
    """
    for unit, lim in limits:
        need = units.get(unit, 0)
        if need > lim.amount:
            return f"{unit} {need} exceeds the limit {format_limit((unit, lim))}"
    return None
