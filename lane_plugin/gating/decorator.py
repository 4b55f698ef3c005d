"""``@lane_task``: a real :class:`prefect.Task` whose body runs inside a :class:`~lane_plugin.Gate`.

The function is wrapped (not the Task subclassed), so every ``@task`` option
passes through. The wrapper keeps the user's function as the task's source,
so task keys and cache keys are those a plain ``@task`` would have; a cache
hit never calls the wrapper, so it neither waits for admission nor settles.

Example:
    >>> @lane_task(stage="draft", estimate=lambda doc: 400 + len(doc) // 3, lane="free", retries=2)
    ... def draft(doc: str):
    ...     return client.chat.completions.create(...)   # usage read from resp.usage
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInput, JobParked, NeverFits, UsageMissing
from ..ledger import Ledger
from .context import Gate
from .estimates import check_estimate, wait_seconds
from .ledgers import next_seq
from .usage import check_missing_policy

if TYPE_CHECKING:
    from prefect import Task

_REFUSALS = (NeverFits, JobParked, UsageMissing, InvalidInput)


def _retry_unless_refused(user_condition: Callable | None) -> Callable:
    """Prefect ``retry_condition_fn``: a ledger refusal is not transient, so it is not retried."""

    def condition(task, task_run, state):
        exc = state.data if isinstance(getattr(state, "data", None), BaseException) else None
        if isinstance(exc, _REFUSALS):
            return False
        return True if user_condition is None else user_condition(task, task_run, state)

    return condition


def _default_run_name(stage: str, fn_name: str) -> Callable[[], str]:
    label = stage if stage == fn_name else f"{stage}:{fn_name}"

    def name() -> str:
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        scope = str(ctx.flow_run.id) if ctx is not None and ctx.flow_run is not None else ""
        return f"{label}-{next_seq(('name', scope, label)) - 1}"

    return name


def lane_task(stage: str, estimate: Any, lane: str = "free", usage: Callable[[Any], Any] | None = None,
              deadline: Any = None, fallback: str | bool | None = None, estimator_version: str | None = None,
              *, missing_usage: str | None = None, ledger: Ledger | str | None = None, **task_options):  # fmt: skip
    """Decorate a function into a real :class:`prefect.Task` whose body is gated by the ledger.

    Args:
        stage: the pipeline stage this task is (tagged ``stage:<stage>``).
        estimate: tokens: an int, a callable of the task's arguments, or an
            estimator object (``.name``, ``.version``, ``.estimate(*args, stage=..., **kwargs)``).
        lane: the lane to wait in (tagged ``lane:<lane>``).
        usage: a callable reading tokens from the return value; default: read
            ``resp.usage`` of OpenAI / LiteLLM / Anthropic shaped responses, ints and dicts.
        deadline: how long to wait for admission (seconds, timedelta or datetime);
            then the job falls back or is parked and the task fails with JobParked.
        fallback: a lane name, or True for the lane's configured fallback.
        estimator_version: recorded as ``est_version`` (an estimator's own by default).
        missing_usage: ``estimate`` (default: bill the estimate, warn) or ``fail``.
        ledger: a :class:`Ledger` or URL; default ``LANE_DATABASE_URL`` or lane.db.
        **task_options: passed to :class:`prefect.Task` unchanged (retries,
            cache_policy, timeout_seconds, tags, task_run_name, ...).

    Example:
        >>> @lane_task(stage="draft", estimate=lambda doc: 400 + len(doc) // 3, retries=2)
        ... def draft(doc: str):
        ...     return client.chat.completions.create(...)
    """
    from prefect import Task

    if not isinstance(stage, str) or not stage.strip():
        raise InvalidInput("stage", stage, "expected a non-empty string")
    if not isinstance(lane, str) or not lane.strip():
        raise InvalidInput("lane", lane, "expected a lane name")
    check_estimate(estimate)
    if usage is not None and not callable(usage):
        raise InvalidInput("usage", usage, "expected a callable reading tokens from the return value")
    wait_seconds(deadline)
    if missing_usage is not None:
        check_missing_policy(missing_usage)
    options = dict(deadline=deadline, fallback=fallback, est_version=estimator_version,
                   missing_usage=missing_usage, ledger=ledger)  # fmt: skip

    def open_gate(args: tuple, kwargs: dict) -> Gate:
        g = Gate(stage, estimate, lane, _args=args, _kwargs=kwargs, **options)
        g._whole_task = True
        return g

    def decorate(fn: Callable) -> Task:
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise InvalidInput("function", fn.__name__, "generator tasks cannot be gated (settle needs one return)")
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def body(*args, **kwargs):
                async with open_gate(args, kwargs) as g:
                    result = await fn(*args, **kwargs)
                    result = await g.areport_result(result, usage)  # a returned stream is read here
                return result
        else:

            @functools.wraps(fn)
            def body(*args, **kwargs):
                with open_gate(args, kwargs) as g:
                    result = fn(*args, **kwargs)
                    result = g.report_result(result, usage)  # a returned stream is read here
                return result

        body.__prefect_task_source__ = fn  # task key and cache key follow the user's code, not ours
        opts = dict(task_options)
        tags = set(opts.pop("tags", None) or ())
        opts["tags"] = sorted(tags | {f"lane:{lane}", f"stage:{stage}"})
        opts.setdefault("task_run_name", _default_run_name(stage, fn.__name__))
        opts["retry_condition_fn"] = _retry_unless_refused(opts.get("retry_condition_fn"))
        return _keep_lane_tags(Task(fn=body, **opts), {f"lane:{lane}", f"stage:{stage}"})

    return decorate


def _keep_lane_tags(task: Task, lane_tags: set[str]) -> Task:
    """``task.with_options(tags=[...])`` replaces a task's tags; keep the lane's on every copy."""
    plain = task.with_options

    def with_options(*args, **kwargs) -> Task:
        if kwargs.get("tags") is not None:
            kwargs["tags"] = sorted(set(kwargs["tags"]) | lane_tags)
        return _keep_lane_tags(plain(*args, **kwargs), lane_tags)

    with_options.__doc__ = plain.__doc__
    task.with_options = with_options  # an instance attribute: the Task class is not touched
    return task


__all__ = ["lane_task"]
