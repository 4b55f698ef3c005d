"""A provider's rate-limit error, recognised without importing its SDK, and how long it says to wait.

When a gated body raises ``openai.RateLimitError``, ``anthropic.RateLimitError``, an
``httpx.HTTPStatusError`` or a ``requests.HTTPError`` with status 429, the gate closes the lane for
every process until the provider's reset (:meth:`lane_plugin.Ledger.pause`). :func:`rate_limit_info`
finds the response on the exception (``.response``, as every one of these carries it) and reads, the
longest that applies:

- ``retry-after-ms`` (milliseconds), else ``retry-after`` (seconds, or an HTTP date);
- ``x-ratelimit-reset-requests`` / ``x-ratelimit-reset-tokens`` (OpenAI: ``"6m0s"``, ``"1s"``, ``"20ms"``)
  of the limits that ran out (``x-ratelimit-remaining-*`` 0; both when none says so and no ``retry-after``
  does);
- ``anthropic-ratelimit-*-reset`` (an RFC 3339 time) of the limits that ran out (the same rule).

A limit's reset is when it is back to full, not when this request fits: a tokens limit with room left but
not enough for the request says ``retry-after`` (when the oldest charges leave) and a reset a whole window
away. Pausing the lane until that reset would idle it for a window after every 429 (and a lane that reopens
on an empty window it knows nothing of meets the outside spend again at once), so the reset counts only
for the limits that ran out, or when the provider says nothing else.

No header at all: :data:`DEFAULT_PAUSE` seconds (a 429 with nothing to go by still means "not now").
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

DEFAULT_PAUSE = 1.0
# The longest a wait for a provider's pause sleeps before it reads the ledger again: a reopen written by any
# process (a probe's success) ends every wait within it, whatever this process remembers of the 429 it heard.
PAUSE_STEP = 0.25
# Longer than this is read as a mistake (a reset time in another unit): capped.
MAX_PAUSE = 3600.0
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class RateLimited:
    """A provider's 429: how long it says to wait, what it named, and the status line for people."""

    seconds: float
    source: str
    what: str


def openai_duration(text: str) -> float | None:
    """OpenAI's reset format in seconds: ``"6m0s"`` 360.0, ``"1s"`` 1.0, ``"20ms"`` 0.02, ``"1h2m3.5s"``.

    Example:
        >>> openai_duration("6m0s"), openai_duration("20ms"), openai_duration("1.5s"), openai_duration("soon")
        (360.0, 0.02, 1.5, None)
    """
    text = text.strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(a + b for a, b in parts) != text:
        try:
            return float(text)  # a bare number of seconds
        except ValueError:
            return None
    return sum(float(n) * _UNIT[u] for n, u in parts)


def _rfc3339_in(text: str, now: float) -> float | None:
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp() - now
    except ValueError:
        return None


def _retry_after(text: str, now: float) -> float | None:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parsedate_to_datetime(text).timestamp() - now
    except (TypeError, ValueError):
        return None


def status_of(exc: BaseException) -> int | None:
    """The HTTP status a provider error carries (``.status_code`` or its ``.response``'s), or None."""
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    if status is None and response is not None:
        status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def headers_of(exc: BaseException) -> Mapping[str, str]:
    """The response headers a provider error carries (lower-case names), or none."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return {}
    try:
        return {str(k).lower(): str(v) for k, v in headers.items()}
    except Exception:  # a header mapping that cannot be read is no reason to fail the settlement
        return {}


def wait_from_headers(headers: Mapping[str, str], now: float | None = None) -> tuple[float, str] | None:
    """How long the headers say to wait, and which header said it (the longest that applies), or None.

    Example:
        >>> wait_from_headers({"retry-after": "2", "x-ratelimit-reset-requests": "6m0s",
        ...                    "x-ratelimit-remaining-requests": "0", "x-ratelimit-remaining-tokens": "900"})
        (360.0, 'x-ratelimit-reset-requests')
        >>> wait_from_headers({"retry-after-ms": "1500"})
        (1.5, 'retry-after-ms')
        >>> wait_from_headers({"retry-after-ms": "300", "x-ratelimit-reset-tokens": "9.9s",
        ...                    "x-ratelimit-remaining-tokens": "220"})   # room left, not enough: not a window
        (0.3, 'retry-after-ms')
    """
    now = time.time() if now is None else now
    found: list[tuple[float, str]] = []
    if "retry-after-ms" in headers:
        try:
            found.append((float(headers["retry-after-ms"]) / 1000.0, "retry-after-ms"))
        except ValueError:
            pass
    # retry-after-ms says the same more precisely (OpenAI rounds retry-after up to whole seconds)
    if (
        "retry-after" in headers
        and "retry-after-ms" not in headers
        and (s := _retry_after(headers["retry-after"], now)) is not None
    ):
        found.append((s, "retry-after"))
    said_when = bool(found)  # retry-after(-ms): the provider's word on when this request fits
    out_of = [
        k[len("x-ratelimit-remaining-") :]
        for k, v in headers.items()
        if k.startswith("x-ratelimit-remaining-") and v.strip() in ("0", "0.0")
    ]
    for kind in ("requests", "tokens"):
        key = f"x-ratelimit-reset-{kind}"
        applies = kind in out_of if (out_of or said_when) else True
        if key in headers and applies and (s := openai_duration(headers[key])) is not None:
            found.append((s, key))
    empty = [
        k.split("-")[2]
        for k, v in headers.items()
        if k.startswith("anthropic-ratelimit-") and k.endswith("-remaining") and v.strip() == "0"
    ]
    for k, v in headers.items():
        if k.startswith("anthropic-ratelimit-") and k.endswith("-reset"):
            kind = k[len("anthropic-ratelimit-") : -len("-reset")]
            applies = kind.split("-")[0] in empty if (empty or said_when) else True
            if applies and (s := _rfc3339_in(v, now)) is not None:
                found.append((s, k))
    if not found:
        return None
    return max(found)


def is_rate_limit_error(exc: BaseException) -> bool:
    """Is ``exc`` a provider's rate-limit error (openai/anthropic ``RateLimitError``, or an HTTP error with status 429)?

    By name and status, so no SDK is imported: a class named ``RateLimitError`` (the SDKs'), or any
    exception whose status (or whose ``.response``'s) is 429 (httpx's ``HTTPStatusError``, requests'
    ``HTTPError``, the SDKs' ``APIStatusError``).
    """
    if any(c.__name__ == "RateLimitError" for c in type(exc).__mro__):
        return True
    return status_of(exc) == 429


def rate_limit_info(exc: BaseException, now: float | None = None) -> RateLimited | None:
    """The provider's word on a rate-limit error (:class:`RateLimited`), or None if ``exc`` is not one.

    Example:
        >>> class FakeResponse:
        ...     status_code, headers = 429, {"retry-after": "3"}
        >>> class HTTPStatusError(Exception):
        ...     response = FakeResponse()
        >>> rate_limit_info(HTTPStatusError("Too Many Requests"))
        RateLimited(seconds=3.0, source='retry-after', what='HTTPStatusError 429 (retry-after 3)')
    """
    if not is_rate_limit_error(exc):
        return None
    headers = headers_of(exc)
    said = wait_from_headers(headers, now)
    seconds, source = said if said is not None else (DEFAULT_PAUSE, "no reset header")
    seconds = min(max(seconds, 0.001), MAX_PAUSE)
    value = headers.get(source)
    what = f"{type(exc).__name__} 429 ({source}{' ' + value if value else ''})"
    return RateLimited(seconds, source, what)


def remaining_of(headers: Mapping[str, Any]) -> dict[str, int]:
    """The provider's own count of what its limits hold (``{unit: used}``: limit less remaining), from a
    response's ``x-ratelimit-limit-*`` / ``x-ratelimit-remaining-*`` (OpenAI) or
    ``anthropic-ratelimit-*-limit`` / ``-remaining`` (Anthropic) headers.

    Example:
        >>> remaining_of({"x-ratelimit-limit-requests": "500", "x-ratelimit-remaining-requests": "480",
        ...               "anthropic-ratelimit-output-tokens-limit": "8000",
        ...               "anthropic-ratelimit-output-tokens-remaining": "7000"})
        {'requests': 20, 'output_tokens': 1000}
    """
    h = {str(k).lower(): str(v) for k, v in headers.items()}
    pairs = {
        "requests": [
            ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests"),
            ("anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining"),
        ],
        "tokens": [
            ("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens"),
            ("anthropic-ratelimit-tokens-limit", "anthropic-ratelimit-tokens-remaining"),
        ],
        "input_tokens": [("anthropic-ratelimit-input-tokens-limit", "anthropic-ratelimit-input-tokens-remaining")],
        "output_tokens": [("anthropic-ratelimit-output-tokens-limit", "anthropic-ratelimit-output-tokens-remaining")],
    }
    out: dict[str, int] = {}
    for unit, options in pairs.items():
        for lim, rem in options:
            if lim in h and rem in h:
                try:
                    out[unit] = max(0, int(float(h[lim])) - int(float(h[rem])))
                except ValueError:
                    continue
                break
    return out
