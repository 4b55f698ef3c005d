"""The emulated provider's bookkeeping: token counting, trace output lengths, rate limits, records.

Everything here is plain Python with an injected clock, so the rate limiter can be
tested to the millisecond without sleeping. :mod:`lane_plugin.testing.provider`
wraps it in an HTTP server.

Counting rules (deterministic, documented so a client can compute them exactly):

- prompt tokens: ``ceil(len(text) / 4)`` for the text of each message (a string, or
  the ``text`` parts of a list of content parts), summed; no per-message overhead;
- rate tokens charged at request time: ``prompt_tokens + max_tokens`` (OpenAI's TPM
  counting), ``max_tokens`` being ``max_completion_tokens``, else ``max_tokens``,
  else the emulator's ``default_max_tokens``;
- billed tokens: ``prompt_tokens + completion_tokens`` of each completed request.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# The emulated completions' text: each word exactly one token under the 4-characters rule (count_tokens).
WORDS = ("the ", "fox ", "ran ", "far ", "and ", "hid ", "in ", "a ", "den ")
WORDS = tuple(w.ljust(4) for w in WORDS)


TRACE_NAMES = {
    "azure-code": "AzureLLMInferenceTrace_code.csv",
    "mooncake": "mooncake_conversation.csv",
}
_INPUT_COLUMNS = ("ContextTokens", "input_length", "input_tokens")
_OUTPUT_COLUMNS = ("GeneratedTokens", "output_length", "output_tokens")


def count_tokens(messages: list[dict]) -> int:
    """Prompt tokens of chat messages as the emulator counts them: ``ceil(chars / 4)`` per message.

    Args:
        messages: OpenAI chat messages (``content`` a string or a list of ``{"type": "text", "text": ...}``).

    Returns:
        The prompt token count.

    Example:
        >>> count_tokens([{"role": "user", "content": "abcdefgh"}, {"role": "user", "content": "a"}])
        3
    """
    total = 0
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        total += math.ceil(len(str(content)) / 4)
    return total


def find_trace(name: str) -> Path:
    """Resolve a trace name (``azure-code``, ``mooncake``) or a path to a CSV file.

    A name is looked up in ``$LANE_TRACES_DIR``, then in a ``shared/traces`` or
    ``traces`` folder of any parent directory of this package.

    Raises:
        FileNotFoundError: naming the places searched.
    """
    path = Path(name)
    if path.suffix == ".csv" and path.exists():
        return path
    file = TRACE_NAMES.get(name, name)

    from ..settings import lane_settings

    traces = lane_settings().traces_dir
    dirs = [Path(traces)] if traces else []
    for parent in Path(__file__).resolve().parents:
        dirs += [parent / "shared" / "traces", parent / "traces"]
    for d in dirs:
        if (d / file).exists():
            return d / file
    raise FileNotFoundError(f"trace {name!r} not found (set LANE_TRACES_DIR); looked in {[str(d) for d in dirs]}")


def load_trace(name: str) -> list[tuple[int, int]]:
    """``(input_tokens, output_tokens)`` of every row of a trace CSV, in file order.

    Reads the Azure (``ContextTokens,GeneratedTokens``), Mooncake
    (``input_length,output_length``) and ``input_tokens,output_tokens`` layouts.
    """
    with find_trace(name).open(newline="") as fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames or []
        col_in = next((c for c in _INPUT_COLUMNS if c in cols), None)
        col_out = next((c for c in _OUTPUT_COLUMNS if c in cols), None)
        if col_in is None or col_out is None:
            raise ValueError(f"{name}: no input/output token columns in {cols}")
        return [(int(row[col_in]), int(row[col_out])) for row in reader]


def draw_length(outputs: list[int], seed: int, request: dict) -> int:
    """The output length of a request: a row of ``outputs`` chosen by a hash of the seed and the request.

    The same seed and the same request (model, messages, ``seed``, ``user``) give the
    same length in any order and any process, so a workload run three ways meets the
    same outputs each time. Capping at ``max_tokens`` is the caller's business.
    """
    key = json.dumps(
        [seed, request.get("model"), request.get("messages"), request.get("seed"), request.get("user")],
        sort_keys=True,
        default=str,
    )
    digest = hashlib.sha256(key.encode()).digest()
    return outputs[int.from_bytes(digest[:8], "big") % len(outputs)]


def duration(seconds: float) -> str:
    """OpenAI's reset-header format: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


@dataclass
class Record:
    """One request as the provider saw it (times in seconds since the emulator started or was reset).

    Attributes:
        t: arrival; the moment rate tokens are charged.
        status: HTTP status (200, 429, 400, ...).
        rate_tokens: tokens charged to the TPM window (0 when refused).
        prompt_tokens: counted prompt tokens.
        max_tokens: the request's completion cap.
        completion_tokens: tokens generated (0 when refused).
        finish_reason: ``stop`` or ``length`` (None when refused).
        limit: what refused it: ``tokens``, ``requests``, ``input_tokens``, ``output_tokens``, ``daily`` or
            ``too_large`` (None when admitted).
        stream: whether the response was streamed.
        t_done: when the response was complete.
        api: ``openai`` (chat completions) or ``anthropic`` (messages).
        t_answered: when a refusal's answer was written out (the earliest a client can know of it).
        request_id: a refusal's request id (its ``x-request-id`` / ``request-id`` header).
        t_received: when the client said it had the refusal's answer (:meth:`ProviderEmulator.received`).
    """

    t: float
    status: int
    rate_tokens: int = 0
    prompt_tokens: int = 0
    max_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    limit: str | None = None
    stream: bool = False
    t_done: float | None = None
    api: str = "openai"
    t_answered: float | None = None
    request_id: str | None = None
    t_received: float | None = None

    @property
    def billed(self) -> int:
        """Tokens billed for this request (``prompt + completion`` of a completed request)."""
        return self.prompt_tokens + self.completion_tokens if self.status == 200 else 0

    def as_dict(self) -> dict:
        return asdict(self)


def sent_at(headers: Any) -> float | None:
    """A request's ``x-client-sent-at`` header (epoch seconds: when the client began it), if it is a number."""
    try:
        return float(headers.get("x-client-sent-at"))
    except (TypeError, ValueError):
        return None


def max_in_window(events: list[tuple[float, int]], window: float) -> tuple[int, float]:
    """The largest sum of amounts over any span ``(t - window, t]``, and the ``t`` where it ends.

    Args:
        events: ``(time, amount)`` pairs, any order.
        window: span length in seconds.

    Example:
        >>> max_in_window([(0.0, 5), (0.5, 5), (1.0, 5), (2.0, 1)], window=1.0)
        (10, 0.5)
    """
    events = sorted(events)
    best, best_t, total, lo = 0, 0.0, 0, 0
    for t, amount in events:
        total += amount
        while events[lo][0] <= t - window:
            total -= events[lo][1]
            lo += 1
        if total > best:
            best, best_t = total, t
    return best, best_t


class Limits:
    """Sliding-window TPM and RPM and a daily quota on billed tokens, as OpenAI counts them.

    A request admitted at ``t`` charges its rate tokens to every span ``(s - window, s]``
    that contains ``t``; it is refused when the charges of the span ending now plus
    its own exceed ``tpm`` (or the span's requests reach ``rpm``). The daily quota
    counts billed tokens in fixed days of ``day_seconds`` from the start; a request is
    refused once ``billed today + its prompt tokens > daily_tokens``.
    Not thread-safe: the emulator holds its lock around every call.
    """

    def __init__(
        self,
        tpm: int,
        rpm: int | None,
        daily_tokens: int | None,
        window_seconds: float,
        day_seconds: float,
        t0: float = 0.0,
        itpm: int | None = None,
        otpm: int | None = None,
    ):
        if tpm <= 0 or window_seconds <= 0 or day_seconds <= 0:
            raise ValueError("tpm, window_seconds and day_seconds must be positive")
        self.tpm, self.rpm, self.daily_tokens = tpm, rpm, daily_tokens
        # Anthropic's: input tokens per window counted at request time, output tokens as generated.
        self.itpm, self.otpm = itpm, otpm
        self._input: deque[tuple[float, int]] = deque()
        self._output: deque[tuple[float, int]] = deque()
        self.window, self.day_seconds, self.t0 = window_seconds, day_seconds, t0
        self._tokens: deque[tuple[float, int]] = deque()  # admitted (t, rate tokens) within the window
        self._requests: deque[float] = deque()
        self._day, self.billed_today = 0, 0

    def _expire(self, now: float) -> None:
        while self._tokens and self._tokens[0][0] <= now - self.window:
            self._tokens.popleft()
        while self._requests and self._requests[0] <= now - self.window:
            self._requests.popleft()
        for q in (self._input, self._output):
            while q and q[0][0] <= now - self.window:
                q.popleft()
        day = int((now - self.t0) // self.day_seconds)
        if day != self._day:
            self._day, self.billed_today = day, 0

    def used_tokens(self, now: float) -> int:
        """Rate tokens charged in the span ``(now - window, now]``."""
        self._expire(now)
        return sum(c for _, c in self._tokens)

    def check(self, now: float, rate_tokens: int, prompt_tokens: int) -> tuple[str | None, float | None]:
        """``(limit, retry_after)``: which limit refuses the request now and when it would fit, or ``(None, None)``.

        ``retry_after`` is the exact wait until the span ending then has room,
        assuming nothing else is admitted meanwhile (None for ``too_large``).
        """
        self._expire(now)
        if rate_tokens > self.tpm:
            return "too_large", None
        if self.rpm is not None and len(self._requests) >= self.rpm:
            return "requests", self._requests[0] + self.window - now
        if self.itpm is not None:
            if prompt_tokens > self.itpm:
                return "too_large", None
            if (wait := _room_at(self._input, prompt_tokens, self.itpm, self.window, now)) is not None:
                return "input_tokens", wait
        if self.otpm is not None and (wait := _room_at(self._output, 1, self.otpm, self.window, now)) is not None:
            return "output_tokens", wait  # no room left for one more generated token
        used = sum(c for _, c in self._tokens)
        if used + rate_tokens > self.tpm:
            for t, c in self._tokens:
                used -= c
                if used + rate_tokens <= self.tpm:
                    return "tokens", t + self.window - now
        if self.daily_tokens is not None and self.billed_today + prompt_tokens > self.daily_tokens:
            return "daily", self.t0 + (self._day + 1) * self.day_seconds - now
        return None, None

    def charge(self, now: float, rate_tokens: int, prompt_tokens: int = 0) -> None:
        """Charge an admitted request to the windows."""
        self._tokens.append((now, rate_tokens))
        self._requests.append(now)
        if self.itpm is not None:
            self._input.append((now, prompt_tokens))

    def generated(self, now: float, tokens: int) -> None:
        """Count output tokens against the output window as they are generated (Anthropic's OTPM)."""
        if self.otpm is not None and tokens:
            self._output.append((now, tokens))

    def anthropic_headers(self, now: float, clock_offset: float) -> dict[str, str]:
        """Anthropic's ``anthropic-ratelimit-*`` headers at ``now``; resets as RFC 3339 times (``clock_offset``
        turns the emulator's clock into epoch seconds)."""
        import datetime as dt

        self._expire(now)

        def at(q_end: float) -> str:
            t = dt.datetime.fromtimestamp(q_end + clock_offset, tz=dt.timezone.utc)
            return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")

        out: dict[str, str] = {}
        if self.rpm is not None:
            out["anthropic-ratelimit-requests-limit"] = str(self.rpm)
            out["anthropic-ratelimit-requests-remaining"] = str(max(0, self.rpm - len(self._requests)))
            out["anthropic-ratelimit-requests-reset"] = at(self._requests[0] + self.window if self._requests else now)
        for name, q, lim in (("input-tokens", self._input, self.itpm), ("output-tokens", self._output, self.otpm)):
            if lim is None:
                continue
            used = sum(c for _, c in q)
            out[f"anthropic-ratelimit-{name}-limit"] = str(lim)
            out[f"anthropic-ratelimit-{name}-remaining"] = str(max(0, lim - used))
            out[f"anthropic-ratelimit-{name}-reset"] = at(q[0][0] + self.window if q else now)
        return out

    def bill(self, now: float, tokens: int) -> None:
        """Count billed tokens against the day's quota."""
        self._expire(now)
        self.billed_today += tokens

    def headers(self, now: float) -> dict[str, str]:
        """The ``x-ratelimit-*`` headers for the state at ``now`` (after charging the current request).

        ``reset-*`` is the time until the newest charge leaves the window, i.e.
        until the limit is back to its initial state.
        """
        self._expire(now)
        used = sum(c for _, c in self._tokens)
        out = {
            "x-ratelimit-limit-tokens": str(self.tpm),
            "x-ratelimit-remaining-tokens": str(max(0, self.tpm - used)),
            "x-ratelimit-reset-tokens": duration(self._tokens[-1][0] + self.window - now if self._tokens else 0),
        }
        if self.rpm is not None:
            out["x-ratelimit-limit-requests"] = str(self.rpm)
            out["x-ratelimit-remaining-requests"] = str(max(0, self.rpm - len(self._requests)))
            out["x-ratelimit-reset-requests"] = duration(
                self._requests[-1] + self.window - now if self._requests else 0
            )
        return out


def _room_at(q: deque[tuple[float, int]], need: int, limit: int, window: float, now: float) -> float | None:
    """Seconds until the window ``q`` has room for ``need`` more under ``limit``; None if it has it now."""
    used = sum(c for _, c in q)
    if used + need <= limit:
        return None
    for t, c in q:
        used -= c
        if used + need <= limit:
            return t + window - now
    return window
