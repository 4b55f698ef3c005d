"""The gate's meter: the usage of one gated block added up across responses, reports and streams.

What one response or usage block holds is read by :mod:`lane_plugin.gating.usage`; the meter adds them up
so that a stream reported chunk by chunk, cumulative usage on every chunk, or one response both reported
and returned counts once, and keeps the output the responses state apart from the billed total (what an
``output_tokens`` limit counts).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from ..checks import MAX_TOKENS, is_number
from ..errors import InvalidInput
from .usage import ANTHROPIC_WEIGHTS, _field, _field_count, _from_block, _output_of, _read, refusal, warn_malformed

_ANTHROPIC_EVENTS = (
    "message_start",
    "message_delta",
    "message_stop",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "ping",
    "text",
    "thinking",
    "signature",
    "input_json",
    "citation",
)


class UsageMeter:
    """Adds up usage reported inside one gated block: ints, responses, and stream chunks or events.

    A stream's chunks are kept per stream (an OpenAI chunk's ``id``, an
    Anthropic message, a Responses ``response.id``) at their newest cumulative
    figure, so a usage chunk seen twice, or cumulative usage on every chunk,
    is counted once; so is a response object both reported and returned.

    A count that is not a count is refused where it is given (:meth:`refuse`): it adds nothing, what was
    counted before it stays, a warning names it (once per meter for the same refusal) and
    :attr:`malformed` is set: the total is known to be short. The total never passes 10**12: usage that
    would take it past is refused the same way. Threads may add to one meter at once.

    Example:
        >>> m = UsageMeter()
        >>> m.add({"object": "chat.completion.chunk", "id": "c1", "usage": None})
        False
        >>> m.add({"object": "chat.completion.chunk", "id": "c1", "usage": {"total_tokens": 50}})
        True
        >>> m.add(7), m.total
        (True, 57)

    :attr:`output` is the output (generated) tokens of what was added, where every part of it states them
    (``completion_tokens`` or ``output_tokens``): what a provider's output limit counts, which the total cannot
    tell once prompt-cache weights are in it. A bare count, or a block with only ``total_tokens``, makes it
    None (unknown).

        >>> m = UsageMeter()
        >>> m.add({"usage": {"input_tokens": 10, "output_tokens": 40, "cache_read_input_tokens": 5000}})
        True
        >>> m.total, m.output
        (550, 40)
        >>> m.add(7), m.output
        (True, None)
    """

    def __init__(self, weights: Mapping[str, float] | None = None):
        self.weights = ANTHROPIC_WEIGHTS if weights is None else {**ANTHROPIC_WEIGHTS, **weights}
        self.found = False
        self.refused = 0  # how many times usage was refused: what was counted is not all the block spent
        self._said: set[str] = set()
        self._plain = 0
        self._plain_output: int | None = 0  # output tokens of the plain additions; None: one of them did not say
        self._streams: dict[Any, int] = {}
        self._stream_output: dict[Any, int | None] = {}
        # Anthropic messages: each one's usage fields so far, and the message each origin (:func:`_origin`) is
        # streaming (until its ``message_stop``). A ``message_delta`` names no message: it continues its own
        # origin's (two streams read at once in two threads or tasks each keep theirs), else it counts what it says
        # as a message of its own. So a stream whose events are reported from several threads or tasks may be counted
        # more than once, never less: one stream, one origin (``track_usage`` gives it its own, whatever thread reads it).
        self._fields: dict[Any, dict[str, Any]] = {}
        self._current: dict[Any, Any] = {}
        self._seq = 0
        self._seen: dict[int, Any] = {}
        self._lock = threading.RLock()  # held over in-memory work only, never over I/O or a callback

    @property
    def malformed(self) -> bool:
        """Some usage was refused: the total is short of what the block spent."""
        return self.refused > 0

    @property
    def total(self) -> int:
        with self._lock:
            return self._plain + sum(self._streams.values())

    @property
    def output(self) -> int | None:
        """Output tokens of what was added; None when some of it did not state them (see the class)."""
        with self._lock:
            parts = [self._plain_output, *self._stream_output.values()]
            return None if any(n is None for n in parts) else sum(n for n in parts if n is not None)

    def add(self, obj: Any, source: str | None = None, stream: Any = None) -> bool:
        """Count ``obj``; True if it carried usage, False for a stream chunk or event without any, or refused.

        Raises :class:`~lane_plugin.errors.InvalidInput` for something that is
        neither usage nor part of a stream (a string, a result with no usage).
        ``source`` says where the usage came from in a refusal's warning; ``stream`` which stream an event
        came from (a tracked or returned stream's token; None: the calling thread's or asyncio task's own).
        """
        origin = _origin(stream)
        try:
            with self._lock:
                took = self._take(obj, origin)
        except InvalidInput as exc:  # a count that is not a count: refused, nothing of it counted
            self.refuse(exc, source)
            return False
        if took is None:
            raise InvalidInput("usage", obj, "no token count found (expected an int or a response with .usage)")
        return took

    def refuse(self, exc: InvalidInput | str, source: str | None = None) -> None:
        """Usage given was not a count: warned (once per meter for the same refusal), :attr:`malformed` set."""
        said = refusal(exc, source)
        with self._lock:
            self.refused += 1
            new = said not in self._said
            self._said.add(said)
        if new:
            warn_malformed(exc, source)

    bad = refuse  # the older name

    def _fits(self, n: int, replacing: int = 0) -> int:
        """``n`` if the block's total stays within 10**12 with it (in place of ``replacing``), else InvalidInput."""
        total = self._plain + sum(self._streams.values()) - replacing + n
        if total > MAX_TOKENS:
            why = f"would bring the block's total to {total:,} tokens, more than {MAX_TOKENS:,}"
            raise InvalidInput("usage", n, why)
        return n

    def _stream(self, key: Any, n: int, output: int | None) -> bool:
        self._streams[key] = self._fits(n, self._streams.get(key, 0))
        self._stream_output[key] = output
        self.found = True
        return True

    def _take(self, obj: Any, origin: Any) -> bool | None:
        """:meth:`add`, None for what is not usage; InvalidInput for a count that is not a count."""
        kind = None if is_number(obj) or isinstance(obj, (str, bytes)) else _field(obj, "type")
        if isinstance(kind, str) and kind in _ANTHROPIC_EVENTS:
            return self._anthropic_event(kind, obj, origin)
        if isinstance(kind, str) and kind.startswith("response."):  # the Responses API's stream events
            resp = _field(obj, "response")
            n = None if resp is None else _read(resp, self.weights)
            return False if n is None else self._stream(("response", _field(resp, "id")), n, _output_of(resp))
        if _field(obj, "object") == "chat.completion.chunk":
            n = None if _field(obj, "usage") is None else _read(obj, self.weights)
            return False if n is None else self._stream(("chunk", _field(obj, "id")), n, _output_of(obj))
        n = _read(obj, self.weights)
        if n is None:
            if not isinstance(obj, (str, bytes)) and _has_usage_slot(obj):
                return False  # a response or chunk whose usage is None: nothing to add
            return None
        if not is_number(obj):
            if self._seen.get(id(obj)) is obj:
                return True  # the same response reported and returned: counted once
        self._plain += self._fits(n)
        out = _output_of(obj)
        self._plain_output = None if out is None or self._plain_output is None else self._plain_output + out
        if not is_number(obj):
            self._seen[id(obj)] = obj
        self.found = True
        return True

    def _anthropic_event(self, kind: str, obj: Any, origin: Any) -> bool:
        if kind == "message_start":
            message = _field(obj, "message")
            self._seq += 1
            key = ("message", _field(message, "id") or self._seq)
            self._fields[key] = {}
            usage = _field(message, "usage")
        elif kind == "message_delta":
            key = self._current.get(origin)
            if key is None:  # a delta without its start (in this stream, thread or task): count what it says
                self._seq += 1
                key = ("message", self._seq)
                self._fields[key] = {}
            usage = _field(obj, "usage")
        else:
            if kind == "message_stop":  # the origin's message is done: a later delta of it is not continued
                self._current.pop(origin, None)
            return False
        self._current[origin] = key  # a start is kept even if its usage is refused below
        fields = _merged(self._fields[key], usage)  # refused whole: the message keeps its fields so far
        self._stream(key, _from_block(fields, self.weights) or 0, fields.get("output_tokens"))
        self._fields[key] = fields
        return True


def _origin(stream: Any) -> Any:
    """Whose Anthropic message a ``message_delta`` continues: the stream's, given; else the asyncio task's or the
    thread's that adds it (a body reporting each event with ``report_usage`` reads one stream per thread or task)."""
    if stream is not None:
        return "stream", stream
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop runs in this thread
        task = None
    return ("thread", threading.get_ident()) if task is None else ("task", id(task))


def _merged(fields: dict[str, Any], usage: Any) -> dict[str, Any]:
    """An Anthropic message's usage fields with the non-null ones of ``usage`` taken (deltas are cumulative)."""
    out = dict(fields)
    if usage is None:
        return out
    for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        value = _field_count(usage, key)
        if value is not None:
            out[key] = value
    split = _field(usage, "cache_creation")
    if split is not None:
        keys = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")
        out["cache_creation"] = {k: _field_count(split, k) for k in keys}
    return out


def _has_usage_slot(obj: Any) -> bool:
    if isinstance(obj, Mapping):
        return "usage" in obj
    return hasattr(obj, "usage")


__all__ = ["UsageMeter"]
