"""A local OpenAI-compatible provider with OpenAI's rate limits, for tests and benchmarks (stdlib only).

``POST /v1/chat/completions`` answers in OpenAI's JSON shape (and as server-sent
events with ``stream: true``, with a final usage chunk when
``stream_options.include_usage`` is set), so the real ``openai`` SDK parses it
into its own types. Limits are counted as OpenAI counts them (see
:mod:`lane_plugin.testing.limits`): a sliding window of ``window_seconds``
charged ``prompt_tokens + max_tokens`` at request time (TPM), a sliding window
of request counts (RPM), and a daily quota of billed tokens. Over a limit the
answer is HTTP 429 with an OpenAI-shaped error, ``retry-after`` (whole seconds,
rounded up), ``retry-after-ms`` (exact) and the ``x-ratelimit-*`` headers,
which every 200 carries too.

Output lengths are drawn from a real trace (a hash of the seed and the request
picks a row), capped at the request's ``max_tokens`` (``finish_reason``
``length`` then); each output token is the 4-character word the counting rule
makes one token. Latency is ``latency_base + latency_per_token * completion``.

Example:
    >>> from openai import OpenAI                                             # doctest: +SKIP
    >>> with ProviderEmulator(tpm=90_000, rpm=3_500) as emu:                  # doctest: +SKIP
    ...     client = OpenAI(base_url=emu.base_url, api_key="x", max_retries=0)
    ...     resp = client.chat.completions.create(model="emu-1", max_tokens=64,
    ...                                           messages=[{"role": "user", "content": "hi"}])
    ...     emu.billed_tokens == resp.usage.total_tokens
    True
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer

from .emulator_http import _Handler
from .limits import Limits, Record, count_tokens, draw_length, duration, load_trace, max_in_window

_LIMIT_TEXT = {"tokens": "tokens per min (TPM)", "requests": "requests per min (RPM)", "daily": "tokens per day (TPD)"}


class ProviderEmulator:
    """An OpenAI-compatible chat completions server in a background thread; a context manager.

    Args:
        tpm: rate tokens allowed per ``window_seconds`` (OpenAI's TPM when the window is 60 s).
        rpm: requests allowed per ``window_seconds``; None for no request limit.
        daily_tokens: billed tokens allowed per ``day_seconds``; None for no quota.
        window_seconds: the sliding window (60 like OpenAI; shorter, with a proportionally
            smaller ``tpm``, to run a benchmark quickly).
        day_seconds: the length of a quota day.
        trace: the trace whose output lengths are drawn: ``azure-code``, ``mooncake`` or a CSV path.
        output_lengths: explicit output lengths to draw from instead of a trace.
        seed: the seed of the draw.
        latency_base: seconds before the first token.
        latency_per_token: seconds per output token.
        default_max_tokens: the cap of a request that sets none.
        model: the model name reported when a request names none.
        clock: the time source (tests inject one); seconds, monotonic.
        sleep: how latency is spent (tests may pass a no-op).
        host: the interface to bind; the port is chosen free.
        itpm: Anthropic's input tokens per window (counted at request time); None: no such limit.
        otpm: Anthropic's output tokens per window, counted as generated as issue 24 models it (a request is
            refused while the window has no room for one more); None: no such limit.

    ``POST /v1/messages`` answers as Anthropic's Messages API (``x-api-key``, ``max_tokens`` required,
    ``anthropic-ratelimit-*`` headers with RFC 3339 resets, 429 ``rate_limit_error`` with ``retry-after``),
    counted against the same windows. :meth:`spend_outside` spends part of the limits as another client on
    the same key would (a shared key), and the emulator counts the requests sent while a 429 it had answered
    still said to wait (``sent_into_closed``), apart from those already on their way when that answer went
    out (``in_flight_at_429``: no client could have held them). When a request was sent is its arrival, or
    what its ``x-client-sent-at`` header says (epoch seconds: the moment the client's code began the call,
    which a benchmark stamps; a request can be begun long before its bytes arrive on a loaded machine).
    A client that tells the emulator when it had each 429's answer in hand (:meth:`received`, by the
    refusal's request id) has its requests counted against that moment instead: no client can hold back a
    request for an answer that has left the server but not yet reached it (``sent_after_answer`` keeps the
    count against the answer's writing).
    """

    def __init__(
        self,
        tpm: int = 90_000,
        rpm: int | None = 3_500,
        daily_tokens: int | None = None,
        *,
        itpm: int | None = None,
        otpm: int | None = None,
        window_seconds: float = 60.0,
        day_seconds: float = 86_400.0,
        trace: str = "azure-code",
        output_lengths: list[int] | None = None,
        seed: int = 0,
        latency_base: float = 0.0,
        latency_per_token: float = 0.0,
        default_max_tokens: int = 1024,
        model: str = "emu-1",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        host: str = "127.0.0.1",
    ):
        self.outputs = list(output_lengths) if output_lengths else [o for _, o in load_trace(trace)]
        if not self.outputs or min(self.outputs) < 0:
            raise ValueError("output lengths must be a non-empty list of non-negative ints")
        self.tpm, self.rpm, self.daily_tokens, self.window_seconds = tpm, rpm, daily_tokens, window_seconds
        self.itpm, self.otpm = itpm, otpm
        self.day_seconds, self.seed, self.model = day_seconds, seed, model
        self.latency_base, self.latency_per_token = latency_base, latency_per_token
        self.default_max_tokens, self.host = default_max_tokens, host
        self.clock, self.sleep = clock, sleep
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.reset()

    # -- lifecycle -------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every record and charge: empty windows, a new day, time 0 is now."""
        with self._lock:
            self.t0 = self.clock()
            self.limits = Limits(
                self.tpm,
                self.rpm,
                self.daily_tokens,
                self.window_seconds,
                self.day_seconds,
                t0=self.t0,
                itpm=self.itpm,
                otpm=self.otpm,
            )
            self._records: list[Record] = []
            self._saying: list[tuple[Record, float]] = []  # the 429s whose reset is still ahead, and that reset
            self.sent_into_closed = 0  # requests sent after such a 429's answer went out (the client did not wait)
            self.in_flight_at_429 = 0  # requests sent before any such answer went out, arriving after a 429
            self.sent_after_answer = 0  # sent after such a 429's answer was written (its client may not have it)
            self.receipts = False  # a client says when it had each 429's answer (received): counted against that
            # (request, the 429 in force, sent (s since the start), whether that 429's answer was out by then)
            self.closed_arrivals: list[tuple[Record, Record, float, bool]] = []
            self.outside_ok = self.outside_refused = 0

    def start(self) -> ProviderEmulator:
        """Bind a free port and serve in a daemon thread."""
        handler = type("Handler", (_Handler,), {"emulator": self})
        self._server = ThreadingHTTPServer((self.host, 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="provider-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ProviderEmulator:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``: pass it as the SDK's ``base_url``."""
        if self._server is None:
            raise RuntimeError("the emulator is not running: use `with ProviderEmulator(...) as emu:`")
        return f"http://{self.host}:{self._server.server_address[1]}/v1"

    # -- what it saw -----------------------------------------------------------------
    @property
    def records(self) -> list[Record]:
        """Every request since the start (or the last :meth:`reset`), in arrival order."""
        with self._lock:
            return list(self._records)

    @property
    def billed_tokens(self) -> int:
        """Prompt plus completion tokens of every completed request."""
        return sum(r.billed for r in self.records)

    @property
    def rejected(self) -> int:
        """How many requests were answered 429."""
        return sum(r.status == 429 for r in self.records)

    def max_window_tokens(self, window_seconds: float | None = None) -> int:
        """The most rate tokens charged in any span of ``window_seconds`` (default: the emulator's window).

        Compare it with ``tpm``: at most ``tpm`` proves no span of the window exceeded TPM.
        """
        events = [(r.t, r.rate_tokens) for r in self.records if r.rate_tokens]
        return max_in_window(events, window_seconds or self.window_seconds)[0]

    def stats(self) -> dict:
        """Totals: requests, 200s, 429s by limit, billed, rate tokens, the busiest window, first and last times."""
        recs = self.records
        ok = [r for r in recs if r.status == 200]
        by_limit: dict[str, int] = {}
        for r in recs:
            if r.status == 429:
                by_limit[r.limit or "?"] = by_limit.get(r.limit or "?", 0) + 1
        return {
            "requests": len(recs),
            "ok": len(ok),
            "rejected_429": sum(by_limit.values()),
            "rejected_by_limit": by_limit,
            "billed_tokens": sum(r.billed for r in ok),
            "rate_tokens": sum(r.rate_tokens for r in recs),
            "max_window_tokens": self.max_window_tokens(),
            "tpm": self.tpm,
            "window_seconds": self.window_seconds,
            "truncated": sum(r.finish_reason == "length" for r in ok),
            "first_t": recs[0].t if recs else None,
            "last_done": max((r.t_done or r.t for r in recs), default=None),
            "sent_into_closed": self.sent_into_closed,
            "in_flight_at_429": self.in_flight_at_429,
            "sent_after_answer": self.sent_after_answer,
            "receipts": self.receipts,
            "outside_ok": self.outside_ok,
            "outside_refused": self.outside_refused,
            "closed_arrivals": self.closed_detail(),
        }

    def closed_detail(self) -> list[dict]:
        """Each request that arrived while a 429 said to wait: when it arrived (s since the start), whether it
        was sent into the closed window (after that 429's answer went out) or was in flight, and its times
        after that 429's arrival and its answer (sent and arrived; None: the answer was not out yet)."""
        with self._lock:
            return [
                {
                    "t": round(r.t, 4),
                    "into_closed": known,
                    "after_429": round(r.t - c.t, 4),
                    "sent_after_answer": None if c.t_answered is None else round(sent - c.t_answered, 4),
                    "arrived_after_answer": None if c.t_answered is None else round(r.t - c.t_answered, 4),
                    "sent_after_receipt": None if c.t_received is None else round(sent - c.t_received, 4),
                    "status": r.status,
                }
                for r, c, sent, known in self.closed_arrivals
            ]

    def spend_outside(self, prompt_tokens: int, max_tokens: int = 0, completion_tokens: int | None = None) -> bool:
        """A request from another client on the same key (not recorded as the lane's): charged to the windows
        as any request, if the limits let it through; True if they did. Output counts as generated at once."""
        with self._lock:
            now = self.clock()
            limit, _ = self.limits.check(now, prompt_tokens + max_tokens, prompt_tokens)
            if limit is not None:
                self.outside_refused += 1
                return False
            self.limits.charge(now, prompt_tokens + max_tokens, prompt_tokens)
            self.limits.generated(now, max_tokens if completion_tokens is None else completion_tokens)
            self.outside_ok += 1
            return True

    # -- the request path ------------------------------------------------------------
    def admit(
        self, body: dict, stream: bool, api: str = "openai", sent_at: float | None = None
    ) -> tuple[Record, dict[str, str], float | None]:
        """Count a request against the limits and record it: the record (200 or 429), headers, retry-after.
        ``sent_at``: when the client began it (epoch seconds, ``x-client-sent-at``; None: its arrival)."""
        messages = body.get("messages")
        prompt = count_tokens(messages) + count_tokens([{"content": body.get("system") or ""}])
        cap = body.get("max_completion_tokens") or body.get("max_tokens") or self.default_max_tokens
        with self._lock:
            now = self.clock()
            rec = Record(t=now - self.t0, status=429, prompt_tokens=prompt, max_tokens=int(cap), stream=stream, api=api)
            self._closed_window(rec, now, sent_at)
            limit, retry = self.limits.check(now, prompt + rec.max_tokens, prompt)
            if limit is None:
                rec.status, rec.rate_tokens = 200, prompt + rec.max_tokens
                self.limits.charge(now, rec.rate_tokens, prompt)
                full = draw_length(self.outputs, self.seed, body)
                rec.completion_tokens = min(full, rec.max_tokens)
                rec.finish_reason = "length" if full > rec.max_tokens else "stop"
            else:
                rec.limit, rec.t_done = limit, now - self.t0
                rec.request_id = f"req_{self.next_id()}"
                if retry is not None:
                    self._saying.append((rec, now + retry))
            if api == "anthropic":
                headers = self.limits.anthropic_headers(now, time.time() - now)
            else:
                headers = self.limits.headers(now)
            if rec.request_id is not None:
                headers["request-id" if api == "anthropic" else "x-request-id"] = rec.request_id
            self._records.append(rec)
        if limit is not None and retry is not None:
            headers["retry-after"] = str(max(1, math.ceil(retry)))
            if api == "openai":  # (Anthropic sends whole seconds only)
                headers["retry-after-ms"] = str(max(1, math.ceil(retry * 1000)))
        return rec, headers, retry

    def finish(self, rec: Record) -> None:
        """Bill a completed request (at the end of generation, as a provider does)."""
        with self._lock:
            now = self.clock()
            rec.t_done = now - self.t0
            self.limits.bill(now, rec.billed)
            self.limits.generated(now, rec.completion_tokens)

    def _closed_window(self, rec: Record, now: float, sent_at: float | None) -> None:
        """Count ``rec`` if it arrived while a 429 said to wait: sent into the closed window when one such 429's
        answer was out before it was sent (in its client's hands, when the client tells :meth:`received`), else
        in flight (lock held)."""
        self._saying = [(c, until) for c, until in self._saying if until > now]
        if not self._saying:
            return
        sent = rec.t if sent_at is None else min(rec.t, sent_at - (time.time() - now) - self.t0)
        answered = [c for c, _ in self._saying if c.t_answered is not None and c.t_answered <= sent]
        known = answered
        if self.receipts:  # the client said when it had each answer: only those in its hands count
            known = [c for c in answered if c.t_received is not None and c.t_received <= sent]
        self.sent_after_answer += bool(answered)
        if known:
            self.sent_into_closed += 1
        else:
            self.in_flight_at_429 += 1
        self.closed_arrivals.append((rec, (known or answered or [c for c, _ in self._saying])[0], sent, bool(known)))

    def answered(self, rec: Record) -> None:
        """A refusal's answer is out: from now its client can know it."""
        with self._lock:
            rec.t_answered = self.clock() - self.t0

    def received(self, request_id: str | None, at: float) -> None:
        """The client had the answer of the refusal ``request_id`` at ``at`` (epoch seconds); from now the requests
        sent into its window are counted against that moment (the one before it is unknown to the emulator)."""
        with self._lock:
            self.receipts = True
            rec = next((r for r in reversed(self._records) if r.request_id == request_id), None)
            if rec is not None and rec.t_received is None:
                rec.t_received = at - (time.time() - self.clock()) - self.t0

    def refusal(self, rec: Record, model: str, retry: float | None) -> dict:
        """The OpenAI-shaped error body of a 429."""
        lim, requested = self.limits, rec.prompt_tokens + rec.max_tokens
        if rec.limit in ("input_tokens", "output_tokens"):
            message = f"Rate limit reached for {model} on {rec.limit.replace('_', ' ')} per window."
        elif rec.limit == "too_large":
            message = (
                f"Request too large for {model} in organization org-emulator on tokens per min (TPM): "
                f"Limit {lim.tpm}, Requested {requested}."
            )
        else:
            with self._lock:
                used = {"tokens": lim.used_tokens(self.clock()), "requests": lim.rpm, "daily": lim.billed_today}[
                    rec.limit
                ]
            limit = {"tokens": lim.tpm, "requests": lim.rpm, "daily": lim.daily_tokens}[rec.limit]
            asked = {"tokens": requested, "requests": 1, "daily": rec.prompt_tokens}[rec.limit]
            message = (
                f"Rate limit reached for {model} in organization org-emulator on {_LIMIT_TEXT[rec.limit]}: "
                f"Limit {limit}, Used {used}, Requested {asked}. "
                f"Please try again in {duration(retry or 0)}."
            )
        kind = "requests" if rec.limit == "requests" else "tokens"
        return {"error": {"message": message, "type": kind, "param": None, "code": "rate_limit_exceeded"}}

    def next_id(self) -> str:
        return f"chatcmpl-emu{next(self._ids):06d}"
