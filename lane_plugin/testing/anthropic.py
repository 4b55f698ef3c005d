"""The emulator's ``POST /v1/messages``: Anthropic's Messages API, its headers and its limits.

Requests carry ``x-api-key`` (or ``authorization: Bearer``, as newer SDKs send it) and a required ``max_tokens``; the answer is Anthropic's ``message`` JSON
(``content`` text blocks, ``stop_reason`` ``end_turn`` or ``max_tokens``, ``usage.input_tokens`` and
``usage.output_tokens``), so the real ``anthropic`` SDK parses it into its own types. Every answer
carries ``anthropic-ratelimit-{requests,input-tokens,output-tokens}-{limit,remaining,reset}`` (resets
as RFC 3339 times); over a limit the answer is 429 with ``retry-after`` and a ``rate_limit_error``.
Input tokens count at request time, output tokens as they are generated
(:meth:`lane_plugin.testing.limits.Limits.generated`). Streaming is not emulated (400).
"""

from __future__ import annotations

import json
import math
from typing import Any

from .limits import WORDS, sent_at


def _send(handler: Any, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
    handler._send_json(status, body, headers, id_header="request-id")


def _error(handler: Any, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
    _send(handler, status, {"type": "error", "error": {"type": kind, "message": message}}, headers)


def handle_messages(handler: Any, raw: bytes) -> None:
    """Answer one ``POST /v1/messages`` on ``handler`` (the emulator's request handler)."""
    emu = handler.emulator
    if not handler.headers.get("x-api-key") and not (handler.headers.get("authorization") or "").startswith("Bearer "):
        return _error(handler, 401, "authentication_error", "x-api-key header is required")
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return _error(handler, 400, "invalid_request_error", "could not parse the JSON body")
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return _error(handler, 400, "invalid_request_error", "messages: must be a non-empty list of objects")
    cap = body.get("max_tokens")
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        return _error(handler, 400, "invalid_request_error", f"max_tokens: expected a positive integer, got {cap!r}")
    if body.get("stream"):
        return _error(handler, 400, "invalid_request_error", "streaming is not emulated on /v1/messages")
    model = body.get("model") or emu.model
    rec, headers, retry = emu.admit(body, False, api="anthropic", sent_at=sent_at(handler.headers))
    if rec.status != 200:
        if retry is not None:
            headers["retry-after"] = str(max(1, math.ceil(retry)))
        what = (rec.limit or "rate").replace("_", " ")
        _error(
            handler,
            429,
            "rate_limit_error",
            f"This request would exceed the rate limit for your organization of {what} per minute.",
            headers,
        )
        return emu.answered(rec)
    text = "".join(WORDS[i % len(WORDS)] for i in range(rec.completion_tokens))
    emu.sleep(emu.latency_base + emu.latency_per_token * rec.completion_tokens)
    emu.finish(rec)
    _send(
        handler,
        200,
        {
            "id": f"msg_{emu.next_id()}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "max_tokens" if rec.finish_reason == "length" else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": rec.prompt_tokens, "output_tokens": rec.completion_tokens},
        },
        headers,
    )
