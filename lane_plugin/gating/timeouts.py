"""Prefect's ``timeout_seconds`` around a gated body: tokens an attempt spent are settled, never lost.

Prefect enforces a sync task's timeout in one of two ways. In the main thread
(with no other SIGALRM handler) an alarm interrupts the blocking call: no
response ever comes back, and the gate bills the estimate, marked
``by_estimate``, because the provider may bill the interrupted call. Anywhere
else it injects an exception at the next bytecode after the blocking call
returns, which would throw away the response that just arrived: there the gate
holds Prefect's shield from admission until the attempt is settled with the
response's usage, then ends the task run timed out as Prefect would have.
The settlement transaction is always shielded, so a timeout cannot roll it
back and leave the attempt leased and unbilled.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time


def shield():
    """Prefect's shield against its own timeout exceptions (deferred to the shield's end), if it has one."""
    try:
        asyncio.get_running_loop()
        return contextlib.nullcontext()  # async: cancellation only lands at an await, and settling awaits none
    except RuntimeError:
        pass
    try:
        from prefect._internal.concurrency.cancellation import shield
    except ImportError:  # pragma: no cover - a Prefect without it: nothing to defer
        return contextlib.nullcontext()
    return shield()


def injected() -> bool:
    """True where Prefect would enforce a timeout by injecting an exception (not by SIGALRM in the main thread)."""
    try:
        asyncio.get_running_loop()
        return False
    except RuntimeError:
        pass
    if threading.current_thread() is not threading.main_thread():
        return True
    handler = signal.getsignal(signal.SIGALRM)
    return type(getattr(handler, "__self__", None)).__name__ != "AlarmCancelScope"


def task_timed_out() -> bool:
    """Whether the running Prefect task run has outlived its ``timeout_seconds``."""
    try:
        from prefect.context import TaskRunContext
    except ImportError:  # pragma: no cover
        return False
    ctx = TaskRunContext.get()
    timeout = getattr(getattr(ctx, "task", None), "timeout_seconds", None)
    run = getattr(ctx, "task_run", None)
    start = getattr(run, "start_time", None)  # the first attempt's start: a retry's clock starts at its own
    state = getattr(run, "state", None)
    if state is not None and state.is_running() and (start is None or state.timestamp > start):
        start = state.timestamp  # this attempt entered Running then (Prefect's timeout counts from there)
    if not timeout or start is None:
        return False
    return time.time() - start.timestamp() >= timeout


def raise_timeout() -> None:
    """Raise what Prefect's own timeout raises inside a task body (so Prefect marks the run TimedOut)."""
    try:
        from prefect._internal.concurrency.cancellation import CancelledError
    except ImportError:  # pragma: no cover
        raise TimeoutError("task run exceeded its timeout_seconds") from None
    raise CancelledError()
