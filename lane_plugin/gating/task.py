"""``LaneTask``: the :class:`prefect.Task` that ``@lane_task`` returns.

It is a ``prefect.Task`` in every respect but one: when Prefect's engine runs
the task, it finds a gated body where it reads ``task.fn`` (see
:mod:`lane_plugin.gating.bodies`). Everywhere else ``task.fn`` is the user's
function itself, untouched, so ``my_task.fn(x)`` - the usual way to unit-test a
task body - calls it directly and never touches the ledger. Prefect builds
everything else from that function too: the task key, the name, the
description, whether the task is async or a generator, classmethod and
staticmethod binding.

``with_options`` returns a ``LaneTask`` again, with the lane's tags (unless the
task was built with ``lane_tags=False``) and the guard that keeps ledger
refusals from being retried.

Example:
    >>> @lane_task(stage="draft", estimate=500)                        # doctest: +SKIP
    ... def draft(doc): ...
    >>> draft.fn("a doc")        # the plain function: no ledger, no task run   # doctest: +SKIP
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Task
from prefect.context import TaskRunContext

from ..errors import InvalidInput, JobParked, LaneError, NeverFits, UnknownLane, UsageMissing
from .bodies import EVERY_RUN, GateSpec, build_body, running_run, user_fn_everywhere
from .ledgers import get_ledger

REFUSALS = (NeverFits, JobParked, UsageMissing, InvalidInput, UnknownLane)
P = ParamSpec("P")
R = TypeVar("R")
_known_lanes: set[tuple[str, str]] = set()  # (ledger URL, lane) found in the ledger by a first call


def check_lanes(task: LaneTask) -> None:
    """At a task's first call (in the flow, before any task run): its lane, and a fallback it names, exist.

    A misspelt lane fails the call once, as a :class:`~lane_plugin.errors.UnknownLane` naming the task
    and the closest lane there is ("did you mean 'mylane'?"), instead of failing every task run with a
    traceback each. Once found, a (ledger, lane) is not read again in this process. A ledger that cannot
    be read now is left to the task runs (they wait for it, or say why).
    """
    spec = task.lane_spec
    names = [spec.lane] + [fb for fb in (spec.options.get("fallback"),) if isinstance(fb, str) and fb]
    try:
        led = get_ledger(spec.options.get("ledger"))
        for name in names:
            if (led.url.raw, name) not in _known_lanes:
                led.lane(name)
                _known_lanes.add((led.url.raw, name))
    except UnknownLane as exc:
        what = "lane" if exc.details.get("lane") == spec.lane else "fallback"
        hint = (
            f"@lane_task {task.name!r} (stage {spec.stage!r}) names it as its {what}; lane lanes lists the lanes, "
            "lane lanes set NAME --create makes one"
        )
        known = [exc.suggestion] if exc.suggestion else []
        raise UnknownLane(exc.details.get("lane"), hint=hint, known=known) from None
    except LaneError:
        return


def retry_unless_refused(condition: Callable | None) -> Callable:
    """Prefect ``retry_condition_fn``: a ledger refusal is not transient, so it is never retried.

    Idempotent: guarding a guard guards the user's condition once. The user's
    condition may be async (Prefect 3.9+ awaits what a condition returns).

    Example:
        >>> retry_unless_refused(None).__lane_user_condition__ is None
        True
    """
    user = getattr(condition, "__lane_user_condition__", condition)
    if user is not None and not callable(user):
        raise TypeError(f"Expected `retry_condition_fn` to be callable, got {type(user).__name__} instead.")

    def unless_refused(task, task_run, state):
        exc = state.data if isinstance(getattr(state, "data", None), BaseException) else None
        if isinstance(exc, REFUSALS):
            return False
        return True if user is None else user(task, task_run, state)

    unless_refused.__lane_user_condition__ = user
    return unless_refused


def _engine_runs(task: LaneTask) -> bool:
    """Is Prefect's engine reading ``task.fn`` to run this task (not user code inside the run)?"""
    ctx = TaskRunContext.get()
    if ctx is None or ctx.task is not task:
        return False
    running = running_run()
    return running is not EVERY_RUN and running != ctx.task_run.id


class LaneTask(Task[P, R]):
    """A :class:`prefect.Task` whose runs are admitted by the token ledger; build it with ``lane_task``."""

    @property
    def fn(self) -> Callable:
        """The user's function; Prefect's engine, running this task, gets the gated body instead."""
        raw = self.__dict__["fn"]
        spec = self.__dict__.get("_lane")
        if spec is not None and _engine_runs(self):
            return build_body(raw, spec)
        return raw

    @fn.setter
    def fn(self, value: Callable) -> None:
        self.__dict__["fn"] = value

    @property
    def lane_spec(self) -> GateSpec:
        """Stage, estimate, lane and the other gate options this task was built with."""
        return self.__dict__["_lane"]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        check_lanes(self)
        return super().__call__(*args, **kwargs)

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        check_lanes(self)
        return super().submit(*args, **kwargs)

    def map(self, *args: Any, **kwargs: Any) -> Any:
        check_lanes(self)
        return super().map(*args, **kwargs)

    def apply_async(self, *args: Any, **kwargs: Any) -> Any:
        check_lanes(self)
        return super().apply_async(*args, **kwargs)

    @functools.wraps(Task.with_options)
    def with_options(self, *args: Any, **kwargs: Any) -> LaneTask:
        spec = self.lane_spec
        if kwargs.get("tags") is not None:
            kwargs["tags"] = sorted(set(kwargs["tags"]) | spec.tags)
        with user_fn_everywhere():
            copy = super().with_options(*args, **kwargs)
        return adopt(copy, spec)


def adopt(task: Task, spec: GateSpec) -> LaneTask:
    """Make ``task`` (a plain ``prefect.Task`` Prefect just built) a gated ``LaneTask``."""
    task.__class__ = LaneTask
    task.__dict__["_lane"] = spec
    task.retry_condition_fn = retry_unless_refused(task.retry_condition_fn)
    return task


__all__ = ["LaneTask", "REFUSALS", "adopt", "check_lanes", "retry_unless_refused"]
