"""What a gated block reports it spent: ints, responses, a returned value or stream, chunks of a tracked
stream, counted by the gate's :class:`~lane_plugin.gating.usage_meter.UsageMeter`; a mixin of
:class:`lane_plugin.gating.context.Gate`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..errors import InvalidInput
from ..ledger import Settled
from .ledgers import run_logger
from .streams import AsyncTrackedStream, TrackedStream, adrain, drain, is_async_stream, is_stream
from .usage import READER_RETURNS
from .usage_meter import UsageMeter


class GateUsage:
    """The usage side of :class:`~lane_plugin.gating.context.Gate`."""

    stage: str
    job_id: str | None
    meter: UsageMeter
    settled: Settled | None

    @property
    def used(self) -> int:
        """Tokens reported so far (ints, responses, and each stream at its newest usage)."""
        return self.meter.total

    def report(self, usage: Any) -> int:
        """Add tokens spent inside the block: an int, an LLM response, or a stream chunk; returns the total.

        A stream chunk or event without usage adds nothing, so ``report_usage(chunk)``
        may be called on every chunk; the same response or usage chunk twice counts once.
        An int of any kind counts (numpy's, an integral ``Decimal`` or float). Anything else (a bool,
        NaN, ``50.7``, ``-5``, text, more than 10**12, or a report that would take the total past it)
        is refused here, without raising: a warning names the value, nothing of it is counted, what was
        reported before stays, and the block bills at least its estimate (``by_estimate``). The
        provider served the call: a bad count neither fails the block nor bills it 0.

        Threads the body starts may call this (``g.report``; :func:`current_gate` finds the gate);
        usage reported after the block settled is not billed (a warning says so).

        Example:
            >>> with gate(stage="drop", estimate=100) as g:             # doctest: +SKIP
            ...     g.report(5000)
            ...     g.report(10**13)    # refused, warned: "invalid usage 10000000000000: absurdly large ..."
            >>> g.settled.actual                                        # doctest: +SKIP
            5000
        """
        if self.settled is not None:
            late = "lane usage: %r reported to %s job %s after it settled: not billed (join the threads that report)"
            run_logger().warning(late, usage, self.stage, self.job_id)
            return self.meter.total
        try:
            self.meter.add(usage, "report_usage()")
        except InvalidInput as exc:  # text, a result without usage: not a count either
            self.meter.refuse(exc, "report_usage()")
        return self.meter.total

    def report_result(self, result: Any, reader: Callable[[Any], Any] | None = None) -> Any:
        """Add the usage read from the block's return value; returns the value to hand back.

        A returned stream is read to its end here (its usage is in its last
        chunk) and a :class:`~lane_plugin.gating.streams.ReplayedStream` of its
        chunks is returned instead. Without ``reader``, a value without usage (text, a bool, None) adds
        nothing. What ``reader`` (the ``usage=`` option) returns is refused as :meth:`report` refuses a
        bad count, and so is an exception it raises: never the task's failure, the block bills at least
        its estimate.
        """
        if reader is None:
            if is_stream(result):
                return drain(result, functools.partial(self._feed, source="the returned stream", stream=object()))
            if not isinstance(result, bool):  # a task's yes/no answer, not a count
                self._feed(result, "the return value")
            return result
        try:
            found = reader(result)
        except Exception as exc:  # the call was served and its result is here: a reader's bug is no failure
            self.meter.refuse(f"the usage= callable's reading (it raised {type(exc).__name__}: {exc})")
            return result
        if found is not None:
            try:
                self.meter.add(found, "usage=")
            except InvalidInput:
                self.meter.refuse(InvalidInput("usage", found, READER_RETURNS), "usage=")
        return result

    async def areport_result(self, result: Any, reader: Callable[[Any], Any] | None = None) -> Any:
        """:meth:`report_result` for an async body (reads a returned async stream)."""
        if reader is None and is_async_stream(result):
            return await adrain(result, functools.partial(self._feed, source="the returned stream", stream=object()))
        return self.report_result(result, reader)

    def _feed(self, obj: Any, source: str = "a tracked stream", stream: Any = None) -> None:
        """Count what carries usage; ignore what does not (text, a chunk without usage); refuse bad counts."""
        try:
            self.meter.add(obj, source, stream)
        except InvalidInput:
            pass

    def track(self, stream: Any) -> Any:
        """``stream`` with each chunk's usage reported to this gate as it passes (sync or async)."""
        feed = functools.partial(self._feed, stream=object())  # this stream's events, whatever thread reads them
        if hasattr(stream, "__aiter__") and not hasattr(stream, "__iter__"):
            return AsyncTrackedStream(stream, feed)
        return TrackedStream(stream, feed)
