"""Estimates as the gate takes them: an int, a callable of the task's arguments, or an estimator."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from ..checks import is_number, tenant_name, tokens
from ..errors import InvalidInput


def is_estimator(obj: Any) -> bool:
    """An estimator object: has ``name``, ``version`` and a callable ``estimate``."""
    return hasattr(obj, "name") and hasattr(obj, "version") and callable(getattr(obj, "estimate", None))


def estimator_label(obj: Any) -> str:
    """What ``est_version`` records for an estimator: its version, prefixed by its name if absent."""
    name, version = str(obj.name), str(obj.version)
    return version if name in version else f"{name}/{version}"


def resolve_estimate(estimate: Any, stage: str, args: tuple = (), kwargs: dict | None = None) -> tuple[int, str | None]:
    """``(tokens, est_version or None)`` for an int, a callable of the task's arguments, or an estimator.

    Example:
        >>> resolve_estimate(lambda doc: 400 + len(doc) // 3, "draft", ("x" * 30,))
        (410, None)
    """
    est, version, _, _ = resolve_parts(estimate, stage, args, kwargs)
    return est, version


def resolve_parts(
    estimate: Any, stage: str, args: tuple = (), kwargs: dict | None = None
) -> tuple[int, str | None, int | None, int]:
    """``(tokens, est_version or None, input tokens or None, est_var)``: what the gate submits.

    The input tokens are known when the estimator breaks its number down
    (``breakdown()``, as :func:`~lane_plugin.estimators.learned` does) or a
    callable returns such a breakdown (an object with ``total``,
    ``input_tokens`` and ``version``, e.g. ``lambda d: EST.breakdown(d.text, stage="critique")``);
    so is ``est_var``, the variance of ``actual - est`` admission keeps headroom
    for, where the breakdown has a ``variance`` (0 otherwise).

    Example:
        >>> resolve_parts(lambda doc: 400 + len(doc) // 3, "draft", ("x" * 30,))
        (410, None, None, 0)
    """
    kwargs = dict(kwargs or {})
    version = None
    if is_estimator(estimate):
        kwargs.setdefault("stage", stage)
        breakdown = getattr(estimate, "breakdown", None)
        value = breakdown(*args, **kwargs) if callable(breakdown) else estimate.estimate(*args, **kwargs)
        version = estimator_label(estimate)
    elif callable(estimate):
        value = estimate(*args, **kwargs)
    else:
        value = estimate
    est_input, est_var = None, 0
    if _is_breakdown(value):
        version = str(value.version) if value.version else version  # the version these very numbers came from
        est_input = None if value.input_tokens is None else tokens("input tokens", value.input_tokens, low=0)
        est_var = tokens("variance", getattr(value, "variance", 0) or 0, low=0)
        value = value.total
    return tokens(f"estimate for stage {stage!r}", value), version, est_input, est_var


def _is_breakdown(value: Any) -> bool:
    return all(hasattr(value, a) for a in ("total", "input_tokens", "version")) and not isinstance(value, (int, float))


def resolve_rate_cost(
    rate_cost: Any, stage: str, args: tuple = (), kwargs: dict | None = None
) -> int | dict[str, int] | None:
    """What the provider's rate limiter counts: None (the estimate), an int, a split ``{"input": ..., "output":
    ...}`` (for a lane's ``input_tokens`` / ``output_tokens`` limits), or a callable of the task's arguments
    returning one of those.

    Example:
        >>> resolve_rate_cost(lambda doc, max_tokens=512: len(doc) // 4 + max_tokens, "draft", ("x" * 400,))
        612
        >>> resolve_rate_cost({"input": 600, "output": 300}, "draft")
        {'input': 600, 'output': 300}
    """
    if rate_cost is None:
        return None
    value = (
        rate_cost(*args, **dict(kwargs or {})) if callable(rate_cost) and not isinstance(rate_cost, dict) else rate_cost
    )
    if isinstance(value, dict):
        return _split(f"rate_cost for stage {stage!r}", value)
    return tokens(f"rate_cost for stage {stage!r}", value)


def _split(field: str, value: dict) -> dict[str, int]:
    if set(value) != {"input", "output"}:
        raise InvalidInput(field, value, 'expected {"input": TOKENS, "output": TOKENS}')
    out = {k: tokens(f"{field} {k}", value[k], low=0) for k in ("input", "output")}
    if out["input"] + out["output"] < 1:
        raise InvalidInput(field, value, "input + output must be at least 1")
    return out


def resolve_tenant(tenant: Any, args: tuple = (), kwargs: dict | None = None) -> str | None:
    """Who a job belongs to: None (the default: the flow run's deployment, else its flow), a string, or a
    callable of the task's arguments returning one.

    Example:
        >>> resolve_tenant(lambda doc, team="search": team, ("x",)), resolve_tenant(None)
        ('search', None)
    """
    if tenant is None:
        return None
    value = tenant(*args, **dict(kwargs or {})) if callable(tenant) else tenant
    return tenant_name(value)


def check_tenant(tenant: Any, *, of_arguments: bool = True) -> None:
    """Before any task runs: None, a tenant name, or (``lane_task`` only) a callable of the task's arguments."""
    if tenant is None or (of_arguments and callable(tenant)):
        return
    if callable(tenant):
        raise InvalidInput("tenant", tenant, "gate() runs inside a task: expected a tenant name, not a callable")
    tenant_name(tenant)


def check_rate_cost(rate_cost: Any, *, of_arguments: bool = True) -> None:
    """Before any task runs: None (the estimate), a token count, or (``lane_task`` only) a callable.

    ``of_arguments=False`` is ``gate()``, which runs inside a task and has no arguments to call it with.
    """
    if isinstance(rate_cost, dict):
        _split("rate_cost", rate_cost)
        return
    _check_tokens_or_callable("rate_cost", rate_cost, of_arguments, none_ok=True)


def check_estimate(estimate: Any, *, of_arguments: bool = True) -> None:
    """The one check of an estimate, for ``lane_task`` and ``gate()`` alike: a token count, an estimator
    object, or (``lane_task`` only) a callable of the task's arguments.

    A token count is an int of any kind (numpy's, an integral ``Decimal`` or float), from 1 to 10**12
    (:func:`lane_plugin.checks.tokens`). ``of_arguments=False`` is ``gate()``.

    Example:
        >>> import numpy as np
        >>> check_estimate(np.int64(100)), check_estimate(np.int64(100), of_arguments=False)
        (None, None)
    """
    if is_estimator(estimate):
        return
    _check_tokens_or_callable("estimate", estimate, of_arguments, none_ok=False)


def _check_tokens_or_callable(field: str, value: Any, of_arguments: bool, *, none_ok: bool) -> None:
    if value is None and none_ok:
        return
    estimator = " or an estimator object" if field == "estimate" else ""
    if callable(value) and not is_number(value):
        if of_arguments:
            return
        why = f"gate() takes a token count{estimator} (inside a task, compute it from your arguments)"
        raise InvalidInput(field, value, why)
    if not is_number(value):
        kinds = "a token count, a callable of the task's arguments" if of_arguments else "a token count"
        raise InvalidInput(field, value, f"expected {kinds}{estimator}")
    tokens(field, value)


def wait_seconds(deadline: Any) -> float | None:
    """``deadline``: seconds to wait for admission, a timedelta, or an aware/naive datetime."""
    if deadline is None:
        return None
    if isinstance(deadline, dt.timedelta):
        return deadline.total_seconds()
    if isinstance(deadline, dt.datetime):
        return deadline.timestamp() - time.time()
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or deadline < 0:
        raise InvalidInput("deadline", deadline, "expected seconds to wait (>= 0), a timedelta or a datetime")
    return float(deadline)
