"""``@lane_task``: a drop-in for Prefect's ``@task`` whose runs are admitted by the token ledger.

It returns a real :class:`prefect.Task` (a :class:`~lane_plugin.gating.task.LaneTask`)
built by Prefect from the user's function, so every ``@task`` option and usage
works as it does with ``@task``: sync and async functions, generators and async
generators, ``@classmethod`` / ``@staticmethod``, callable objects and
``functools.partial``; Prefect's task names, run names, task keys and cache keys;
``with_options``; ``submit``, ``map``; and ``my_task.fn``, which stays the user's
function and goes through no ledger. Only a task run's body is gated: it waits
for admission, holds a renewed lease while it runs and settles what it spent. A
cache hit runs no body, so it neither waits nor settles.

Example:
    >>> @lane_task(stage="draft", estimate=lambda doc: 400 + len(doc) // 3, lane="free", retries=2)
    ... def draft(doc: str):
    ...     return client.chat.completions.create(...)   # usage read from resp.usage
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ..errors import InvalidInput
from ..ledger import Ledger
from .estimates import check_estimate, check_rate_cost, check_tenant, wait_seconds
from .usage import NO_USAGE, _NoUsage, check_missing_policy

if TYPE_CHECKING:
    from .task import LaneTask

P = ParamSpec("P")
R = TypeVar("R")


def lane_task(
    stage: str,
    estimate: Any,
    lane: str = "free",
    usage: Callable[[Any], Any] | _NoUsage | None = None,
    deadline: Any = None,
    fallback: str | bool | None = None,
    estimator_version: str | None = None,
    *,
    rate_cost: Any = None,
    missing_usage: str | None = None,
    ledger: Ledger | str | None = None,
    lane_tags: bool = True,
    tenant: Any = None,
    **task_options: Any,
) -> Callable[[Callable[P, R]], LaneTask[P, R]]:
    """Decorate a function into a real :class:`prefect.Task` whose runs are gated by the ledger.

    Args:
        stage: the pipeline stage this task is (tagged ``stage:<stage>``).
        estimate: tokens: an int, a callable of the task's arguments, or an
            estimator object (``.name``, ``.version``, ``.estimate(*args, stage=..., **kwargs)``).
        lane: the lane to wait in (tagged ``lane:<lane>``).
        usage: how the tokens a run spent are found besides :func:`report_usage`:
            ``None`` (default) reads ``resp.usage`` of OpenAI / LiteLLM /
            Anthropic shaped return values, ints and dicts; a callable reads
            them from the return value (and from each yielded value of a
            generator); :data:`NO_USAGE` declares a task that uses no tokens:
            the return value is not read, and a run that reported nothing
            settles 0 tokens without a warning.
        deadline: how long to wait for admission (seconds, timedelta or datetime);
            then the job falls back or is parked and the task fails with JobParked.
        fallback: a lane name, or True for the lane's configured fallback.
        estimator_version: recorded as ``est_version`` (an estimator's own by default).
        rate_cost: what the provider's rate limiter counts for the call: an int or a callable
            of the task's arguments (e.g. ``lambda doc: len(doc) // 4 + 1024`` for prompt +
            ``max_tokens``, as OpenAI counts TPM); default the estimate. The lane's sliding
            burst window counts it, so no ``window_seconds`` span admits more than ``burst_tokens``.
        missing_usage: ``estimate`` (default: bill the estimate and warn, once
            per task) or ``fail``.
        ledger: a :class:`Ledger` or URL; default ``LANE_DATABASE_URL`` or lane.db.
        tenant: who its jobs belong to inside the lane (a string, or a callable of the task's
            arguments returning one): the lane is shared fairly by tokens between its tenants. Default:
            the flow run's deployment name, else the flow's name, else ``default``.
        lane_tags: tag the task ``lane:<lane>`` and ``stage:<stage>`` (default).
            Prefect looks up a tag concurrency limit for every tag of every task
            run, so each tag costs a server round trip per run; ``False`` runs
            the task with only its own tags. With the tags on,
            ``with_options(tags=[...])`` keeps them.
        **task_options: passed to :class:`prefect.Task` unchanged (name, retries,
            cache_policy, timeout_seconds, tags, task_run_name, retry_condition_fn, ...).

    Returns:
        A decorator; applied to a function it returns a :class:`prefect.Task`.

    Raises:
        InvalidInput: a bad stage, lane, estimate, rate_cost, usage, deadline or missing_usage.

    Example:
        >>> @lane_task(stage="draft", estimate=lambda doc: 400 + len(doc) // 3, retries=2)
        ... def draft(doc: str):
        ...     return client.chat.completions.create(...)
        >>> @lane_task(stage="index", estimate=1, usage=NO_USAGE, lane_tags=False)
        ... def index(doc: str):
        ...     return store.put(doc)      # no tokens: settles 0, no warning
    """
    if not isinstance(stage, str) or not stage.strip():
        raise InvalidInput("stage", stage, "expected a non-empty string")
    if not isinstance(lane, str) or not lane.strip():
        raise InvalidInput("lane", lane, "expected a lane name")
    check_estimate(estimate)
    check_rate_cost(rate_cost)
    check_tenant(tenant)
    reader = None if isinstance(usage, _NoUsage) else usage  # NO_USAGE: no reader, nothing read
    no_usage = usage is NO_USAGE
    if not no_usage and usage is not None and not callable(usage):
        raise InvalidInput(
            "usage", usage, "expected None, a callable reading tokens from the return value, or NO_USAGE"
        )
    wait_seconds(deadline)
    if missing_usage is not None:
        check_missing_policy(missing_usage)
        if no_usage:
            raise InvalidInput("missing_usage", missing_usage, "a task declared usage=NO_USAGE has no usage to miss")
    if not isinstance(lane_tags, bool):
        raise InvalidInput("lane_tags", lane_tags, "expected True or False")
    from .bodies import GateSpec

    spec = GateSpec(
        stage,
        estimate,
        lane,
        usage=reader,
        no_usage=no_usage,
        options=dict(
            deadline=deadline,
            fallback=fallback,
            est_version=estimator_version,
            missing_usage=missing_usage,
            ledger=ledger,
            rate_cost=rate_cost,
            tenant=tenant,
        ),
        tags=frozenset({f"lane:{lane}", f"stage:{stage}"} if lane_tags else ()),
    )

    def decorate(fn: Callable[P, R]) -> LaneTask[P, R]:
        from . import send_guard, termination
        from .task import LaneTask, adopt

        termination.install()  # usually at import, in the main thread, before Prefect's flow engine runs
        send_guard.preload()  # the same: the httpx packages the guard patches, never imported under a lease
        opts = dict(task_options)
        tags = set(opts.pop("tags", None) or ()) | spec.tags
        if tags:
            opts["tags"] = sorted(tags)
        return adopt(LaneTask(fn=fn, **opts), spec)

    return decorate


__all__ = ["NO_USAGE", "lane_task"]
