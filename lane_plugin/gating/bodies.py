"""The gated bodies Prefect's engine runs for a ``@lane_task``: one per kind of function.

The user's function stays ``task.fn`` (see :mod:`lane_plugin.gating.task`); when
Prefect's engine is about to run it for a task run, it gets one of these bodies
instead, built around that function:

* a function or a coroutine function: one gate around the call; the usage is
  what :func:`report_usage` added plus what the return value carries;
* a generator or an async generator: the lease is held while the generator is
  consumed; each yielded value's usage (and a sync generator's return value's)
  is added as it comes, and the job settles once, when the generator is
  exhausted, raises, or is closed early (a consumer that stops early ends the
  job normally: ``done``, billed what was used so far).

:func:`report_usage` inside a generator adds to its gate; between two steps the
consumer's own code is outside it.

Example:
    >>> body = build_body(lambda x: x, spec)                          # doctest: +SKIP
    >>> body(3)   # waits for admission, runs the function, settles     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageMissing
from .context import Gate
from .ledgers import run_logger

# The task run whose user function is running now: inside it, ``task.fn`` is the user's
# function again (a body calling its own task's ``.fn`` must not open a second gate).
_running_run: contextvars.ContextVar[Any] = contextvars.ContextVar("lane_running_run", default=None)
EVERY_RUN = object()  # ``_running_run`` while a copy is built: ``.fn`` is the user's in every run


@dataclass(frozen=True, eq=False)
class GateSpec:
    """What ``lane_task(...)`` was told: how to open a gate for one task run.

    Shared by a task and every copy ``with_options`` makes of it, so "once per
    task" (the missing-usage warning) means once per decorated function.
    """

    stage: str
    estimate: Any
    lane: str
    usage: Callable[[Any], Any] | None
    no_usage: bool
    options: dict = field(default_factory=dict)
    tags: frozenset = frozenset()

    def open(self, args: tuple, kwargs: dict, *, stepwise: bool = False) -> Gate:
        g = Gate(self.stage, self.estimate, self.lane, _args=args, _kwargs=kwargs, **self.options)
        g._whole_task = True
        g._missing_key = self  # the missing-usage warning: once per task, not once per run
        g._stepwise = stepwise
        return g

    def add(self, g: Gate, value: Any) -> Any:
        """Add the usage ``value`` carries (a return value or a yielded one); returns what to hand on.

        A stream is read to its end first and handed on replayed (:meth:`Gate.report_result`).
        """
        return value if self.no_usage else g.report_result(value, self.usage)

    async def aadd(self, g: Gate, value: Any) -> Any:
        """:meth:`add` in an async body (an async stream is read there)."""
        return value if self.no_usage else await g.areport_result(value, self.usage)

    def finish(self, g: Gate) -> None:
        """Before settling: a task declared ``usage=NO_USAGE`` has no tokens, so none is not missing."""
        if self.no_usage:
            g.report(0)


def running_run() -> Any:
    """The task run whose user function is running in this context, if any."""
    return _running_run.get()


@contextlib.contextmanager
def user_code(g: Gate | None = None) -> Iterator[None]:
    """Run the user's function: ``task.fn`` is the user's, and ``report_usage`` adds to ``g``."""
    from prefect.context import TaskRunContext

    ctx = TaskRunContext.get()
    token = _running_run.set(ctx.task_run.id if ctx is not None else None)
    try:
        if g is not None and g._stepwise:
            with g.current():
                yield
        else:
            yield
    finally:
        _running_run.reset(token)


@contextlib.contextmanager
def user_fn_everywhere() -> Iterator[None]:
    """Inside the block ``.fn`` of every lane task is the user's function (``with_options`` copies it)."""
    token = _running_run.set(EVERY_RUN)
    try:
        yield
    finally:
        _running_run.reset(token)


def build_body(fn: Callable, spec: GateSpec) -> Callable:
    """A gated body around ``fn``, of ``fn``'s kind (the kind Prefect's engine expects).

    The kind is read with the same tests :class:`prefect.Task` uses, so the
    engine Prefect picked for the task always gets a body it can run.
    ``functools.wraps`` copies ``fn``'s attributes, among them the
    ``__prefect_self__`` / ``__prefect_cls__`` Prefect sets on a bound method's
    function, and ``__prefect_task_source__`` tells Prefect (3.9+) to key caches
    on ``fn``'s code, not this wrapper's.
    """
    if inspect.isasyncgenfunction(fn):
        body = _async_generator_body(fn, spec)
    elif inspect.isgeneratorfunction(fn):
        body = _generator_body(fn, spec)
    elif inspect.iscoroutinefunction(fn):
        body = _coroutine_body(fn, spec)
    else:
        body = _function_body(fn, spec)
    body = functools.wraps(fn)(body)
    body.__prefect_task_source__ = fn
    return body


def _function_body(fn: Callable, spec: GateSpec) -> Callable:
    def body(*args, **kwargs):
        with spec.open(args, kwargs) as g:
            with user_code():
                result = fn(*args, **kwargs)
            result = spec.add(g, result)
            spec.finish(g)
        return result

    return body


def _coroutine_body(fn: Callable, spec: GateSpec) -> Callable:
    async def body(*args, **kwargs):
        async with spec.open(args, kwargs) as g:
            with user_code():
                result = await fn(*args, **kwargs)
            result = await spec.aadd(g, result)
            spec.finish(g)
        return result

    return body


def _closed_early(g: Gate, spec: GateSpec) -> None:
    run_logger().warning(
        "lane gate: %s job %s was closed before it reported any token usage; billed its estimate of %d tokens",
        spec.stage,
        g.job_id,
        g.est,
    )


def _generator_body(fn: Callable, spec: GateSpec) -> Callable:
    def body(*args, **kwargs):
        g = spec.open(args, kwargs, stepwise=True)
        closed: GeneratorExit | None = None
        result = None
        try:
            with g:
                with user_code(g):
                    gen = fn(*args, **kwargs)
                try:
                    sent = None
                    while True:
                        try:
                            with user_code(g):
                                item = gen.send(sent)
                        except StopIteration as stop:
                            result = stop.value
                            break
                        sent = yield spec.add(g, item)
                    if result is not None:  # a generator's ``return value``
                        result = spec.add(g, result)
                except GeneratorExit as exc:  # the consumer stopped early: a normal end
                    with user_code(g):
                        gen.close()
                    closed = exc
                spec.finish(g)
        except UsageMissing:
            if closed is None:
                raise
            _closed_early(g, spec)  # missing_usage="fail", but nobody is left to fail
        if closed is not None:
            raise closed
        return result

    return body


def _async_generator_body(fn: Callable, spec: GateSpec) -> Callable:
    async def body(*args, **kwargs):
        g = spec.open(args, kwargs, stepwise=True)
        closed: GeneratorExit | None = None
        try:
            async with g:
                with user_code(g):
                    agen = fn(*args, **kwargs)
                try:
                    sent = None
                    while True:
                        try:
                            with user_code(g):
                                item = await agen.asend(sent)
                        except StopAsyncIteration:
                            break
                        sent = yield await spec.aadd(g, item)
                except GeneratorExit as exc:
                    with user_code(g):
                        await agen.aclose()
                    closed = exc
                spec.finish(g)
        except UsageMissing:
            if closed is None:
                raise
            _closed_early(g, spec)
        if closed is not None:
            raise closed

    return body


__all__ = ["EVERY_RUN", "GateSpec", "build_body", "running_run", "user_code", "user_fn_everywhere"]
