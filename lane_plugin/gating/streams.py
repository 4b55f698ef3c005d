"""Streamed responses inside a gate: their usage arrives with the last chunk, not with the call.

Two ways a gated task streams:

* it **iterates** the stream: wrap it, ``for chunk in track_usage(stream): ...``
  (or call ``report_usage(chunk)`` on every chunk); each chunk's usage goes to
  the gate as it passes, so the final usage chunk is billed even if the loop
  stops early after it;
* it **returns** the stream: the gate reads it to its end inside the lease
  (Prefect hands a task's return value over only once the task run is over, so
  nothing reaches the caller sooner either way), bills the usage of its last
  chunk, and the task returns a :class:`ReplayedStream` of the same chunks.

Ask OpenAI for the usage chunk with ``stream_options={"include_usage": True}``;
without it a stream carries no usage and the job is billed its estimate,
marked ``by_estimate`` (or fails, with ``missing_usage="fail"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def is_stream(obj: Any) -> bool:
    """A one-shot SDK stream (``openai.Stream``, ``anthropic.Stream``, ``MessageStream``): an iterator with ``.response``."""
    return hasattr(obj, "__next__") and hasattr(obj, "response") and not isinstance(obj, ReplayedStream)


def is_async_stream(obj: Any) -> bool:
    """An async SDK stream (``openai.AsyncStream``, ``anthropic.AsyncStream``)."""
    return hasattr(obj, "__anext__") and hasattr(obj, "response") and not isinstance(obj, AsyncReplayedStream)


class _Wrapped:
    def __init__(self, stream: Any, sink: Callable[[Any], Any]):
        self._stream = stream
        self._it = None
        self._sink = sink

    def __getattr__(self, name: str):
        if name.startswith("__") or "_stream" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self._stream, name)


class TrackedStream(_Wrapped):
    """A stream whose chunks are told to ``sink`` as they pass; otherwise the stream itself.

    Iteration, ``with``, ``close()`` and every other attribute (``response``,
    ``text_stream``, ...) are the wrapped stream's.
    """

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            self._it = iter(self._stream)
        chunk = next(self._it)
        self._sink(chunk)
        return chunk

    def __enter__(self):
        enter = getattr(self._stream, "__enter__", None)
        if enter is not None:
            enter()
        return self

    def __exit__(self, *exc):
        exit_ = getattr(self._stream, "__exit__", None)
        return exit_(*exc) if exit_ is not None else None


class AsyncTrackedStream(_Wrapped):
    """:class:`TrackedStream` for ``async for``."""

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._it is None:
            self._it = self._stream.__aiter__()
        chunk = await self._it.__anext__()
        self._sink(chunk)
        return chunk

    async def __aenter__(self):
        enter = getattr(self._stream, "__aenter__", None)
        if enter is not None:
            await enter()
        return self

    async def __aexit__(self, *exc):
        exit_ = getattr(self._stream, "__aexit__", None)
        return (await exit_(*exc)) if exit_ is not None else None


class ReplayedStream:
    """The chunks of a stream a gated task returned, read to its end inside the lease; iterate it again.

    ``chunks`` holds them; other attributes are the original stream's (``response``).
    """

    def __init__(self, chunks: list, original: Any = None):
        self.chunks = chunks
        self._original = original

    def __iter__(self):
        return iter(self.chunks)

    def __len__(self) -> int:
        return len(self.chunks)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def close(self) -> None:
        return None

    def __getattr__(self, name: str):
        if name.startswith("__") or self.__dict__.get("_original") is None:
            raise AttributeError(name)
        return getattr(self._original, name)


class AsyncReplayedStream(ReplayedStream):
    """:class:`ReplayedStream` for ``async for``."""

    def __aiter__(self):
        return _aiter(self.chunks)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None


async def _aiter(chunks: list):
    for c in chunks:
        yield c


def drain(stream: Any, sink: Callable[[Any], Any]) -> ReplayedStream:
    """Read a returned stream to its end, telling ``sink`` each chunk; its replay."""
    chunks = []
    try:
        for chunk in stream:
            sink(chunk)
            chunks.append(chunk)
    finally:
        close = getattr(stream, "close", None)
        if callable(close):
            close()
    return ReplayedStream(chunks, stream)


async def adrain(stream: Any, sink: Callable[[Any], Any]) -> AsyncReplayedStream:
    """:func:`drain` for an async stream."""
    chunks = []
    try:
        async for chunk in stream:
            sink(chunk)
            chunks.append(chunk)
    finally:
        close = getattr(stream, "close", None)
        if callable(close):
            result = close()
            if hasattr(result, "__await__"):
                await result
    return AsyncReplayedStream(chunks, stream)


__all__ = [
    "AsyncReplayedStream",
    "AsyncTrackedStream",
    "ReplayedStream",
    "TrackedStream",
    "adrain",
    "drain",
    "is_async_stream",
    "is_stream",
]
