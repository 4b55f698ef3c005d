"""The flow run's token bill: a ``lane-bill`` table artifact, published when the run finishes.

No call in user code: the first gated task of a flow run registers a state hook
named ``lane_bill`` on the running flow (completion, failure, crash and
cancellation). When the run reaches one of those states, Prefect's flow engine
calls the hook inside the flow run's own context, and the hook reads the run's
bill from each ledger its gated tasks used (:meth:`Ledger.run_bill`, by
``run_key`` = flow run id) and publishes it as a table artifact keyed
``lane-bill``, linked to that flow run. The key keeps every run's bill, so the
Artifacts page shows the bill history across runs.

Why a state hook: Prefect calls flow state hooks from the flow run engine, in
the process that runs the flow, for sync and async flows and subflows alike
(each subflow is its own flow run with its own bill), after the flow function
has returned or raised, so a failed run is billed too. Gated tasks in a thread
pool share the flow run's process and register into the same table. Tasks run
by a remote task runner (Dask, Ray) register in their own processes, where the
flow object is not running: their jobs are still in the ledger
(``Ledger.run_bill(flow_run_id)``) but no artifact is published for them.

Example:
    >>> rows = bill_rows(led.run_bill(flow_run_id))            # doctest: +SKIP
    >>> rows[0]["stage"], rows[0]["drift"]                     # doctest: +SKIP
    ('critique', 2.12)
"""

from __future__ import annotations

import json
from typing import Any

from ..ledger import BillLine, Ledger
from .shielded_log import shielded

KEY = "lane-bill"
HOOK_LISTS = ("on_completion_hooks", "on_failure_hooks", "on_crashed_hooks", "on_cancellation_hooks")
log = shielded("lane_plugin.bill")  # its calls hold a Prefect timeout off: see shielded_log
_runs: dict[str, dict[int, Ledger]] = {}  # flow run id -> the ledgers its gated jobs used


def note_run(flow_run_id: str | None, ledger: Ledger) -> bool:
    """Remember that a gated job of ``flow_run_id`` used ``ledger``; hook the running flow once.

    Returns True the first time this flow run is seen; the flow run's log then
    says which ledger (its URL, password masked) its gated tasks use.
    """
    if not flow_run_id:
        return False
    new: dict = {}
    used = _runs.setdefault(flow_run_id, new)  # single dict operations: no lock an interrupted thread could keep
    first = used is new
    used.setdefault(id(ledger), ledger)
    if first:
        _hook_flow(flow_run_id, ledger)
    return first


def _hook_flow(flow_run_id: str, ledger: Ledger) -> None:
    try:
        from prefect.context import FlowRunContext
    except ImportError:  # pragma: no cover - prefect is a dependency
        return
    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow is None or ctx.flow_run is None or str(ctx.flow_run.id) != flow_run_id:
        log.debug("flow run %s is not running in this process: no lane-bill hook", flow_run_id)
        return
    for name in HOOK_LISTS:  # first sight of the run only (one thread): no lock
        hooks = getattr(ctx.flow, name, None)
        if isinstance(hooks, list) and lane_bill not in hooks:
            hooks.append(lane_bill)
    try:
        from prefect.logging.loggers import flow_run_logger

        flow_run_logger(ctx.flow_run, ctx.flow).info(
            "lane gate: this flow run's gated tasks use the ledger at %s; its lane-bill artifact is "
            "published when the run finishes",
            ledger.url,
        )
    except Exception:  # pragma: no cover - a log line must not fail a task
        log.debug("could not log the ledger URL", exc_info=True)


def _fmt_wait(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 2)


def bill_rows(lines: list[BillLine]) -> list[dict[str, Any]]:
    """The ``lane-bill`` table: one row per stage and lane, and a total row when there are several."""
    rows = [
        {
            "stage": b.stage,
            "lane": b.lane,
            "tenant": b.tenant,
            "jobs": b.jobs,
            "estimated": b.estimated,
            "actual": b.actual,
            "drift": b.drift,
            "overage": b.overage,
            "billed_by_estimate": b.by_estimate,
            "wait_p50_s": _fmt_wait(b.wait_p50),
            "wait_max_s": _fmt_wait(b.wait_max),
            "unsettled": b.unsettled,
            "rate_limited_429": b.rate_limited,
        }
        for b in lines
    ]
    if len(lines) > 1:
        est, act = sum(b.estimated for b in lines), sum(b.actual for b in lines)
        waits = [b.wait_max for b in lines if b.wait_max is not None]
        rows.append(
            {
                "stage": "(all)",
                "lane": ", ".join(sorted({b.lane for b in lines})),
                "tenant": ", ".join(sorted({t for b in lines for t in b.tenant.split(", ") if t})),
                "jobs": sum(b.jobs for b in lines),
                "estimated": est,
                "actual": act,
                "drift": round(act / est, 2) if est else None,
                "overage": sum(b.overage for b in lines),
                "billed_by_estimate": sum(b.by_estimate for b in lines),
                "wait_p50_s": None,
                "wait_max_s": _fmt_wait(max(waits)) if waits else None,
                "unsettled": sum(b.unsettled for b in lines),
                "rate_limited_429": sum(b.rate_limited for b in lines),
            }
        )
    return rows


def bill_summary(lines: list[BillLine], ledger_url: str, state_name: str) -> str:
    """One paragraph for the artifact's description and the flow run's log."""
    jobs = sum(b.jobs for b in lines)
    est, act = sum(b.estimated for b in lines), sum(b.actual for b in lines)
    parts = [
        f"{jobs} gated job(s) of this flow run ({state_name}): {act:,} tokens billed against "
        f"{est:,} estimated" + (f" (drift {act / est:.2f})" if est else "")
    ]
    by_lane: dict[str, int] = {}
    for b in lines:
        by_lane[b.lane] = by_lane.get(b.lane, 0) + b.actual
    if len(by_lane) > 1:  # a fallback (or several lanes): what each lane was billed
        parts.append("billed by lane: " + ", ".join(f"{lane} {n:,}" for lane, n in sorted(by_lane.items())))
    overage = sum(b.overage for b in lines)
    if overage:
        parts.append(f"{overage:,} tokens of overage")
    by_est = sum(b.by_estimate for b in lines)
    if by_est:
        parts.append(f"{by_est} attempt(s) billed by estimate because no usage was found")
    limited = {b.stage: 0 for b in lines}
    for b in lines:
        limited[b.stage] += b.rate_limited
    if any(limited.values()):
        parts.append("provider 429s met: " + ", ".join(f"{s} {n}" for s, n in limited.items() if n))
    unsettled = sum(b.unsettled for b in lines)
    if unsettled:
        parts.append(f"{unsettled} job(s) never billed (parked or still waiting)")
    worst = max((b for b in lines if b.drift is not None), key=lambda b: b.drift, default=None)
    if worst is not None and worst.drift > 1.0:
        parts.append(f"the largest overspend is stage {worst.stage} at {worst.drift:.2f}x its estimate")
    return "; ".join(parts) + f". Ledger: {ledger_url}. Drift = actual / estimated of billed jobs; waits in seconds."


def publish(flow_run_id: str, state_name: str, ledger: Ledger, logger=None) -> list[dict] | None:
    """Read the bill of ``flow_run_id`` from ``ledger`` and publish it as the ``lane-bill`` artifact."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    lines = ledger.run_bill(flow_run_id)
    if not lines:
        return None
    rows = bill_rows(lines)
    summary = bill_summary(lines, str(ledger.url), state_name)
    with get_client(sync_client=True) as client:
        client.create_artifact(
            artifact=ArtifactCreate(
                type="table",
                key=KEY,
                description=summary,
                data=json.dumps(rows),
                flow_run_id=flow_run_id,
            )
        )
    if logger is not None:
        logger.info("lane bill: %s", summary)
    return rows


def lane_bill(flow, flow_run, state) -> None:
    """Prefect flow state hook: publish this flow run's ``lane-bill`` (registered by the gate)."""
    run_id = str(flow_run.id)
    used = _runs.pop(run_id, None)
    if not used:
        return
    try:
        from prefect.logging.loggers import flow_run_logger

        logger = flow_run_logger(flow_run, flow)
    except Exception:  # pragma: no cover - logging must not stop the bill
        logger = log
    for ledger in used.values():
        try:
            publish(run_id, state.name or str(state.type), ledger, logger)
        except Exception as exc:  # the run's outcome stands; say why there is no bill
            logger.warning("lane bill: could not publish the lane-bill artifact from %s: %s", ledger.url, exc)


__all__ = ["KEY", "bill_rows", "bill_summary", "lane_bill", "note_run", "publish"]
