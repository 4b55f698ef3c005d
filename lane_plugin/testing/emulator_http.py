"""The provider emulator's HTTP side: one keep-alive connection answering ``POST /v1/chat/completions`` as
OpenAI does (JSON, or server-sent events in chunked encoding) and ``GET /v1/models``; ``POST /v1/messages``
is handed to :mod:`lane_plugin.testing.anthropic`. What is counted and refused is decided by
:class:`lane_plugin.testing.provider.ProviderEmulator`."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from .limits import WORDS, Record, sent_at


class _Handler(BaseHTTPRequestHandler):
    """One HTTP/1.1 connection (keep-alive): JSON answers, SSE streams in chunked encoding."""

    emulator: Any  # the ProviderEmulator it serves (ProviderEmulator.start sets it)
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stall
    server_version = "provider-emulator/1"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's name
        pass

    def _send_json(
        self, status: int, body: dict, headers: dict[str, str] | None = None, id_header: str = "x-request-id"
    ) -> None:
        """One JSON response; ``id_header`` names the request id as the provider does (Anthropic: ``request-id``)."""
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        if id_header not in (headers or {}):
            self.send_header(id_header, f"req_{self.emulator.next_id()}")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        self._send_json(status, {"error": {"message": message, "type": kind, "param": None, "code": code}})

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path.rstrip("/") == "/v1/models":
            model = {"id": self.emulator.model, "object": "model", "created": 0, "owned_by": "emulator"}
            return self._send_json(200, {"object": "list", "data": [model]})
        self._error(404, f"Unknown request URL: GET {self.path}.", code="unknown_url")

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path.split("?")[0].rstrip("/") == "/v1/messages":
            from .anthropic import handle_messages

            return handle_messages(self, raw)
        if self.path.split("?")[0].rstrip("/") != "/v1/chat/completions":
            return self._error(404, f"Unknown request URL: POST {self.path}.", code="unknown_url")
        if not (self.headers.get("authorization") or "").startswith("Bearer "):
            return self._error(401, "You didn't provide an API key.", code="invalid_api_key")
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self._error(400, "We could not parse the JSON body of your request.")
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return self._error(400, "'messages' must be a non-empty array of objects.", code="invalid_value")
        cap = body.get("max_completion_tokens", body.get("max_tokens"))
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            return self._error(
                400, f"Invalid 'max_tokens': {cap!r}; expected a positive integer.", code="invalid_value"
            )
        emu, stream = self.emulator, bool(body.get("stream"))
        model = body.get("model") or emu.model
        rec, headers, retry = emu.admit(body, stream, sent_at=sent_at(self.headers))
        if rec.status != 200:
            self._send_json(429, emu.refusal(rec, model, retry), headers)
            return emu.answered(rec)
        text = "".join(WORDS[i % len(WORDS)] for i in range(rec.completion_tokens))
        usage = {
            "prompt_tokens": rec.prompt_tokens,
            "completion_tokens": rec.completion_tokens,
            "total_tokens": rec.prompt_tokens + rec.completion_tokens,
        }
        base = {"id": emu.next_id(), "created": int(time.time()), "model": model, "system_fingerprint": "fp_emu"}
        if stream:
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            return self._stream(rec, headers, base, text, usage if include else None)
        emu.sleep(emu.latency_base + emu.latency_per_token * rec.completion_tokens)
        emu.finish(rec)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": None},
            "logprobs": None,
            "finish_reason": rec.finish_reason,
        }
        self._send_json(200, {**base, "object": "chat.completion", "choices": [choice], "usage": usage}, headers)

    def _stream(self, rec: Record, headers: dict, base: dict, text: str, usage: dict | None) -> None:
        emu = self.emulator
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        extra = {"usage": None} if usage is not None else {}

        def chunk(delta: dict, finish: str | None = None) -> dict:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**base, "object": "chat.completion.chunk", "choices": [choice], **extra}

        def send(data: str) -> None:
            payload = f"data: {data}\n\n".encode()
            self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
            self.wfile.flush()

        try:
            emu.sleep(emu.latency_base)
            send(json.dumps(chunk({"role": "assistant", "content": "", "refusal": None})))
            step = 4  # tokens per chunk
            for i in range(0, rec.completion_tokens, step):
                n = min(step, rec.completion_tokens - i)
                emu.sleep(emu.latency_per_token * n)
                send(json.dumps(chunk({"content": text[i * 4 : (i + n) * 4]})))
            send(json.dumps(chunk({}, rec.finish_reason)))
            if usage is not None:
                send(json.dumps({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage}))
            send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:  # the client went away: the tokens were generated and are billed all the same
            self.close_connection = True
        finally:
            emu.finish(rec)
