"""The gate's view of the process: one ledger per URL, and the Prefect run it is in."""

from __future__ import annotations

import itertools

from ..ledger import Ledger
from ..ledger.url import resolve_url
from ..settings import lane_settings
from . import termination, timeouts
from .events import PrefectListener
from .shielded_log import ShieldedLogger, shielded

log = shielded("lane_plugin.gate")  # its calls hold a Prefect timeout off: see shielded_log
_ledgers: dict[str, Ledger] = {}
_seq: dict[tuple, itertools.count] = {}  # (task run, run count, stage) -> the next gate() block's number


def get_ledger(ledger: Ledger | str | None = None) -> Ledger:
    """The process's ledger for ``ledger``, with events on.

    ``ledger`` is a :class:`Ledger`, a URL, a block (``lane-ledger/prod`` or
    ``block:lane-ledger/prod``), or None for ``LANE_DATABASE_URL`` / the default.
    One :class:`Ledger` per URL per process (it keeps a connection per thread);
    its :class:`~lane_plugin.gating.events.PrefectListener` turns ledger events
    into Prefect events, and its ``send_slack`` is ``LANE_SEND_SLACK_SECONDS``
    (a :class:`Ledger` passed in keeps its own).

    Example:
        >>> get_ledger("sqlite:////tmp/lanes.db") is get_ledger("sqlite:////tmp/lanes.db")   # doctest: +SKIP
        True
    """
    termination.install()  # SIGTERM gives this process's leases back and ends it within its grace
    if isinstance(ledger, Ledger):
        if not any(isinstance(x, PrefectListener) for x in ledger.listeners):
            ledger.listeners.append(PrefectListener(ledger))
        return ledger
    url = resolve_url(ledger)
    # Single dict operations, no lock: an exception raised into a thread (Prefect's timeout) at any bytecode
    # cannot leave one held for every other gated thread to wait on.
    led = _ledgers.get(url)
    if led is None:
        new = Ledger(url, send_slack=lane_settings().send_slack_seconds)
        new.listeners.append(PrefectListener(new))
        led = _ledgers.setdefault(url, new)  # the first thread's wins (the other has not connected yet)
    return led


def run_logger() -> ShieldedLogger:
    """Prefect's run logger in a run, else the gate's; its calls (and getting it) hold a Prefect timeout off."""
    try:
        from prefect.context import FlowRunContext, TaskRunContext
        from prefect.logging import get_run_logger

        if TaskRunContext.get() or FlowRunContext.get():
            with timeouts.shield():  # logging.getLogger takes logging's module lock before its try, as handlers do
                return ShieldedLogger(get_run_logger())
    except Exception:
        pass
    return log


def prefect_run() -> tuple[str | None, int | None, str | None]:
    """``(task run id, run_count, flow run id)`` of the task run we are in, or Nones."""
    try:
        from prefect.context import TaskRunContext
    except ImportError:  # pragma: no cover - prefect is a dependency
        return None, None, None
    ctx = TaskRunContext.get()
    if ctx is None or ctx.task_run is None:
        return None, None, None
    tr = ctx.task_run
    return str(tr.id), max(1, int(tr.run_count or 1)), str(tr.flow_run_id) if tr.flow_run_id else None


def next_seq(scope: tuple) -> int:
    counter = _seq.get(scope)
    if counter is None:
        while len(_seq) > 10_000:  # the oldest scopes go (dicts keep insertion order)
            try:
                _seq.pop(next(iter(_seq)), None)
            except (StopIteration, RuntimeError):  # emptied, or changed by another thread meanwhile
                break
        counter = _seq.setdefault(scope, itertools.count(1))
    return next(counter)  # one C call: no lock


_tenant_of_run: dict[str, str] = {}  # flow run id -> its default tenant (one lookup per run; no lock: issue 22)


def default_tenant(flow_run_id: str | None) -> str:
    """A gated job's tenant when none is given: its flow run's deployment name, else its flow's name, else
    ``default`` (a job outside any flow run). Looked up once per flow run (a deployment's name costs one
    API read), never failing the gate: what cannot be read falls back to the next."""
    from ..policy.fairness import DEFAULT_TENANT

    if flow_run_id is None:
        return DEFAULT_TENANT
    hit = _tenant_of_run.get(flow_run_id)
    if hit is not None:
        return hit
    name = _deployment_or_flow(flow_run_id) or DEFAULT_TENANT
    name = "".join(ch if ch.isprintable() else "?" for ch in name)  # a valid tenant name (no control characters)
    while len(_tenant_of_run) > 10_000:  # the oldest runs go (dicts keep insertion order)
        try:
            _tenant_of_run.pop(next(iter(_tenant_of_run)), None)
        except (StopIteration, RuntimeError):  # emptied, or changed by another thread meanwhile
            break
    _tenant_of_run[flow_run_id] = name  # one C call: no lock
    return name


def _deployment_or_flow(flow_run_id: str) -> str | None:
    try:
        from prefect.client.orchestration import get_client
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        here = ctx is not None and ctx.flow_run is not None and str(ctx.flow_run.id) == flow_run_id
        with get_client(sync_client=True) as client:
            flow_run = ctx.flow_run if here and ctx is not None else client.read_flow_run(flow_run_id)
            if flow_run is not None and flow_run.deployment_id is not None:
                return str(client.read_deployment(flow_run.deployment_id).name)[:64] or None
            if here and ctx is not None and ctx.flow is not None:
                return str(ctx.flow.name)[:64] or None
            return None if flow_run is None else str(client.read_flow(flow_run.flow_id).name)[:64] or None
    except Exception as exc:  # the tenant is a label: a lookup that fails never fails the gate
        log.debug("lane gate: no deployment or flow name for flow run %s: %s", flow_run_id, exc)
        return None
