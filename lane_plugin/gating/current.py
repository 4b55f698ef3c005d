"""Which gate a report goes to: the one running in this context, found by :func:`report_usage`.

A gated block (a ``@lane_task`` body, ``with gate(...)``) makes its gate the current one in a
context variable while it runs, so ``report_usage(resp)`` anywhere in the body adds to it. Python
copies no context into a thread the body starts: run the thread's work in a copy of the body's context
(``contextvars.copy_context().run``), where ``report_usage()`` finds the gate again and the send guard
sees the thread's requests (a thread handed only the gate, :func:`current_gate`'s ``.report()``, bills
right but its requests pass the guard untouched).
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any, Protocol

from ..errors import LaneError


class RunningGate(Protocol):
    """What a report needs of the running gate (:class:`lane_plugin.gating.context.Gate`)."""

    def report(self, usage: Any) -> int: ...

    def track(self, stream: Any) -> Any: ...


_current: contextvars.ContextVar[RunningGate | None] = contextvars.ContextVar("lane_gate", default=None)


def current_gate() -> RunningGate | None:
    """The innermost gate running in this context (a ``@lane_task`` body, a ``with gate(...)`` block), or None.

    A thread the body starts does not inherit it (Python copies no context into a new thread): run the
    thread's work in a copy of the body's context (``contextvars.copy_context().run``, a copy per call), where
    ``report_usage()`` finds the gate and the send guard holds and hears the thread's requests. A thread handed
    only the gate (its ``.report()``) bills right, but its requests pass the send guard untouched (not held
    while the lane is paused). Report before the block ends: join the threads inside the body.

    Example:
        >>> from concurrent.futures import ThreadPoolExecutor
        >>> @lane_task(stage="fanout", estimate=lambda docs: 900 * len(docs))          # doctest: +SKIP
        ... def fanout(docs):
        ...     def one(doc):
        ...         resp = client.chat.completions.create(...)
        ...         report_usage(resp)                  # from the pool's thread, to the task's gate
        ...         return resp.choices[0].message.content
        ...     with ThreadPoolExecutor(4) as pool:
        ...         calls = [pool.submit(contextvars.copy_context().run, one, doc) for doc in docs]
        ...         return [call.result() for call in calls]
    """
    return _current.get()


def _outside(name: str) -> LaneError:
    """The error for ``report_usage()`` / ``track_usage()`` with no gate running here."""
    where = ""
    thread = threading.current_thread()
    if thread is not threading.main_thread():
        where = (
            f" (in thread {thread.name!r}: a thread the body starts does not inherit the gate; pass it "
            "current_gate() from the body and call its .report(), or run the work in contextvars.copy_context().run)"
        )
    return LaneError(
        f"{name}() called outside a gated block{where}: use it inside a @lane_task body or `with gate(...)`"
    )


def track_usage(stream: Any) -> Any:
    """Wrap a streamed LLM response so its usage reaches the running gate as the chunks pass.

    Works for OpenAI streams (ask for ``stream_options={"include_usage": True}``),
    Anthropic streams and events, sync or async; the wrapper is the stream otherwise.

    Example:
        >>> stream = client.chat.completions.create(..., stream=True,             # doctest: +SKIP
        ...                                         stream_options={"include_usage": True})
        >>> text = "".join(c.choices[0].delta.content or "" for c in track_usage(stream) if c.choices)  # doctest: +SKIP
    """
    g = _current.get()
    if g is None:
        raise _outside("track_usage")
    return g.track(stream)


def report_usage(usage: Any) -> int:
    """Add tokens to the innermost running gate: an int or an LLM response; returns its total so far.

    A bad count is refused as :meth:`lane_plugin.gating.context.Gate.report` refuses it (a warning naming the value; never raised).
    From a thread the body starts, see :func:`current_gate`.

    Example:
        >>> report_usage(resp)       # inside a @lane_task body          # doctest: +SKIP
        1412
    """
    g = _current.get()
    if g is None:
        raise _outside("report_usage")
    return g.report(usage)


__all__ = ["current_gate", "report_usage", "track_usage"]
