"""The Prefect gate: admit a task's body against the token ledger, then settle what it spent.

Change one decorator and an LLM stage waits for room in its lane, holds a
lease while it runs and bills what it really used:

Example:
    >>> from prefect import flow
    >>> from lane_plugin import lane_task
    >>> @lane_task(stage="draft", estimate=lambda doc: 400 + len(doc) // 3, retries=2)
    ... def draft(doc: str):
    ...     return client.chat.completions.create(...)   # usage read from resp.usage
    >>> @flow
    ... def summarize(docs: list[str]):
    ...     return [draft(d) for d in docs]

Inside a task you cannot re-decorate, gate one block:

    >>> with gate(stage="critique", estimate=1800) as g:        # doctest: +SKIP
    ...     g.report(client.messages.create(...))

What happens, in order, when the body is about to run (a cache hit runs no
body, so it neither waits nor settles):

1. intake: the job is keyed by the Prefect task run id, its attempt is the task run's
   ``run_count`` (a retry is a new attempt; two runs never share a lease or a settlement)
   and its run key the flow run id, so a run under way may finish past the start limit;
2. admission: the waiter ticks the lane once, then waits to be woken by a hand-off at
   settlement (:mod:`lane_plugin.ledger.wakeups`); past the deadline the job falls back or
   is parked (:class:`~lane_plugin.errors.JobParked`); a wait ended by an exception parks it;
3. while the body runs, a background thread renews the lease;
4. settlement: what was reported (:func:`report_usage`, :func:`track_usage`) plus the usage
   read from the return value; a bad count is refused where it is given, warned naming the
   value (:mod:`~lane_plugin.gating.usage`); a body stopped by a timeout or cancellation bills
   at least its estimate (:mod:`~lane_plugin.gating.timeouts`); an estimate billed because no
   valid usage was found is marked ``by_estimate``.

A task that returns text rather than the response reports the response first:

    >>> resp = client.chat.completions.create(...)               # doctest: +SKIP
    >>> report_usage(resp)
    >>> return resp.choices[0].message.content
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import time
from collections.abc import Iterator
from typing import Any

from ..errors import NeverFits, UsageMissing
from ..ledger import Lease, Ledger, Settled
from ..ledger.waiters import waiter_id
from ..settings import lane_settings
from . import timeouts, tokenlog, waiting
from .admission_wait import LOG_FIRST, AdmissionWait
from .bill import note_run
from .current import RunningGate, _current, current_gate, report_usage, track_usage
from .estimates import (
    check_estimate,
    check_rate_cost,
    check_tenant,
    resolve_parts,
    resolve_rate_cost,
    resolve_tenant,
    wait_seconds,
)
from .gate_usage import GateUsage
from .ledgers import default_tenant, get_ledger, next_seq, prefect_run, run_logger
from .provider_pause import ProviderPause
from .ratelimits import PAUSE_STEP
from .renewal import Held, renewer
from .usage import check_missing_policy
from .usage_meter import UsageMeter

WATCHDOG_CHECK = 1.0  # a waiter asks the watchdog whether its wake-up watcher lives at least this often
ASYNC_CHECK = 0.01  # an async waiter looks at its wake-up event this often (no database read)
_missing_said: set[Any] = set()  # the missing-usage warning is said once per task (or per gate() stage)


# -- the gate -------------------------------------------------------------------------
class Gate(AdmissionWait, ProviderPause, GateUsage):
    """One gated block: intake, admission, a renewed lease and one settlement.

    Use :func:`gate` (or :func:`lane_task`) rather than building one directly.

    Args:
        stage: the pipeline stage, e.g. ``"draft"``.
        estimate: tokens as an int, or an estimator object (called with ``stage=``): what the
            budget is charged until the block settles to what it really used.
        lane: the lane to wait in (default ``free``).
        rate_cost: what the provider's rate limiter counts for the call (e.g. prompt tokens +
            ``max_tokens``, as OpenAI counts TPM): an int, or a callable of the task's arguments;
            default the estimate. The lane's sliding burst window counts it.
        deadline: how long to wait for admission: seconds, a timedelta or a datetime.
        fallback: a lane name, or True for the lane's configured fallback.
        est_version: what ``est_version`` to record (an estimator's own by default).
        missing_usage: ``estimate`` (bill the estimate and warn) or ``fail``.
        ledger: a :class:`Ledger` or URL; default ``LANE_DATABASE_URL`` or lane.db.
        tenant: who the job belongs to inside the lane (shared fairly by tokens between its tenants):
            a name, or (``lane_task``) a callable of the task's arguments; default the flow run's
            deployment name, else the flow's name, else ``default``.
        key: idempotency key; default the Prefect task run id (and a sequence number).
        attempt: default the task run's ``run_count``.
        run_key: default the Prefect flow run id.

    Example:
        >>> with gate(stage="critique", estimate=1800) as g:            # doctest: +SKIP
        ...     g.report(client.messages.create(...))
    """

    def __init__(
        self,
        stage: str,
        estimate: Any,
        lane: str = "free",
        *,
        rate_cost: Any = None,
        deadline: Any = None,
        fallback: str | bool | None = None,
        est_version: str | None = None,
        missing_usage: str | None = None,
        ledger: Ledger | str | None = None,
        key: str | None = None,
        attempt: int | None = None,
        run_key: str | None = None,
        tenant: Any = None,
        _args: tuple[Any, ...] = (),
        _kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.stage, self.lane = stage, lane
        self.est, version, self.est_input, self.est_var = resolve_parts(estimate, stage, _args, _kwargs)
        self.rate_cost = resolve_rate_cost(rate_cost, stage, _args, _kwargs)
        self.tenant = resolve_tenant(tenant, _args, _kwargs)
        self.est_version = est_version or version
        self.wait_seconds = wait_seconds(deadline)
        self.fallback = fallback
        self.missing_usage = check_missing_policy(missing_usage or lane_settings().missing_usage)
        self._ledger_arg = ledger
        self.key, self.attempt, self.run_key = key, attempt, run_key
        self.job_id: str | None = None  # written by the intake (_job: once it is)
        self.lease: Lease | None = None  # held once admitted
        self._waited_pause = False  # the body waited for a provider's pause to end after admission
        self.meter = UsageMeter()
        self._shield = contextlib.ExitStack()
        self._shielded = False
        self._held: Held | None = None
        self._token: contextvars.Token[RunningGate | None] | None = None
        self.settled: Settled | None = None
        self._whole_task = False  # lane_task: the job is the whole task run
        self._missing_key: Any = ("stage", stage, lane)  # lane_task: its task, so "once per task"
        self._stepwise = False  # a generator's gate is current only while the generator runs

    # -- enter ----------------------------------------------------------------------
    def _intake(self) -> Ledger:
        led = get_ledger(self._ledger_arg)
        task_run, run_count, flow_run = prefect_run()
        if self.key is None and task_run is not None:
            self.key = f"prefect-task-run:{task_run}"
            if not self._whole_task:  # gate() blocks: several per task run, numbered per stage
                self.key += f":{self.stage}:{next_seq((task_run, run_count, self.stage))}"
        if self.attempt is None:
            self.attempt = run_count or 1
        if self.run_key is None:
            self.run_key = flow_run
        if flow_run is not None and self.run_key == flow_run:
            note_run(flow_run, led)  # the flow run's lane-bill is published when it finishes
        try:
            with timeouts.shield():  # a timeout landing in the submit is raised once its job id is known
                self.job_id = led.submit(
                    self.stage,
                    self.est,
                    self.lane,
                    rate_cost=self.rate_cost,
                    est_version=self.est_version,
                    est_input=self.est_input,
                    run_key=self.run_key,
                    key=self.key,
                    attempt=self.attempt,
                    est_var=self.est_var,
                    waiter=waiter_id(),
                    wait_seconds=self.wait_seconds,
                    fallback=self.fallback,
                    rerun=True,
                    tenant=self.tenant or default_tenant(flow_run),
                )
        except NeverFits as exc:
            run_logger().error("lane gate: %s job (%s tokens) can never be admitted: %s", self.stage, self.est, exc)
            raise
        return led

    def _admitted(self, led: Ledger, waited: float) -> None:
        if timeouts.injected() and not self._stepwise:  # a generator's consumer runs between its steps
            # Prefect delivers a sync task's timeout in a worker thread by injecting an exception at the
            # next bytecode after a blocking call returns: it would throw away the LLM response (and its
            # usage) the call just brought back. Defer it until this attempt is settled; it is raised then.
            # The shield is let go while a nested Prefect timeout scope is open in the body (it would deadlock).
            self._shield.enter_context(timeouts.BodyShield())
            self._shielded = True
        lease = self.lease
        assert lease is not None, "a gate is admitted once it holds a lease"
        self._held = renewer().hold(led, lease, run_logger(), owner=self, frame=self._block_frame())
        tokenlog.admitted(
            run_logger(),
            led,
            stage=self.stage,
            lane=lease.lane,
            est=self.est,
            waited=waited,
            attempt=lease.attempt,
            job_id=lease.job_id,
            asked=self.lane,
        )
        if not self._stepwise:
            self._token = _current.set(self)

    def _forget_current(self) -> None:
        # Admitted, then failed before the block began (the provider's pause, a timeout): report_usage() in this
        # thread must not go on adding to a gate that is gone.
        token, self._token = self._token, None
        if token is not None:
            try:
                _current.reset(token)
            except ValueError:  # set in another context (an async gate resumed elsewhere): clear it here
                _current.set(None)

    def _block_frame(self) -> Any:
        """The frame whose ``with`` this gate is (the caller of ``__enter__``), for the renewer's liveness check."""
        f: Any = sys._getframe(1)
        while f is not None and f.f_code.co_filename == __file__:
            f = f.f_back
        if (
            f is None
            or f.f_code.co_name in ("__enter__", "enter_context")
            or f.f_code.co_filename == contextlib.__file__
        ):
            return None  # entered by a wrapper that returns (an ExitStack): no frame stands for the block
        return f

    @contextlib.contextmanager
    def current(self) -> Iterator[Gate]:
        """Make this gate the one :func:`report_usage` adds to, for the duration of the block."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def __enter__(self) -> Gate:
        led = get_ledger(self._ledger_arg)
        # An exception raised into this thread (a timeout) at any bytecode up to the return lands in this try:
        # once the job is written (even in its submit) abandon parks it or gives its lease back. Nothing after
        # the lease is held runs outside it: the ``with`` calls __exit__ only if __enter__ returned.
        try:
            self._intake()
            w = led.wakeups.register(self._job, self.lane)
            try:
                state = {"t0": time.monotonic(), "next_log": time.monotonic() + LOG_FIRST, "first": True}
                while (sleep := self._poll(led, state, w)) is not None:
                    led.wakeups.check_alive()  # the watchdog: a stuck watcher fails the task, never hangs it
                    led.wakeups.keep(w)
                    w.event.wait(min(sleep, WATCHDOG_CHECK))
            finally:
                led.wakeups.unregister(self.job_id)
            self._admitted(led, time.monotonic() - state["t0"])  # a timeout landing here: abandon gives the lease back
            while (left := self._paused_for(led)) > 0:
                time.sleep(min(left, PAUSE_STEP))
            self._resent(led)
            return self
        except BaseException as exc:
            self._forget_current()
            self._drop_probe(led)
            waiting.abandon(led, self, exc)
            raise

    async def __aenter__(self) -> Gate:
        led = get_ledger(self._ledger_arg)
        try:  # as in __enter__
            self._intake()
            w = led.wakeups.register(self._job, self.lane)
            try:
                state = {"t0": time.monotonic(), "next_log": time.monotonic() + LOG_FIRST, "first": True}
                while (sleep := self._poll(led, state, w)) is not None:
                    led.wakeups.check_alive()
                    led.wakeups.keep(w)
                    end = time.monotonic() + min(sleep, WATCHDOG_CHECK)
                    while not w.event.is_set() and time.monotonic() < end:  # the event is set by another thread
                        await asyncio.sleep(min(ASYNC_CHECK, max(0.0, end - time.monotonic())))
            finally:
                led.wakeups.unregister(self.job_id)
            self._admitted(led, time.monotonic() - state["t0"])
            while (left := self._paused_for(led)) > 0:
                await asyncio.sleep(min(left, PAUSE_STEP))
            self._resent(led)
            return self
        except BaseException as exc:
            self._forget_current()
            self._drop_probe(led)
            waiting.abandon(led, self, exc)
            raise

    # -- exit -----------------------------------------------------------------------
    def __exit__(self, exc_type: type[BaseException] | None, *exc_and_traceback: object) -> None:
        with self._shield, timeouts.shield():  # a timeout (deferred, or landing now) is raised after the settlement
            exc = exc_and_traceback[0] if exc_and_traceback else None
            try:
                self._exit(exc_type, exc)
            finally:
                self._probe_done(get_ledger(self._ledger_arg), exc if isinstance(exc, BaseException) else None)
            if self._shielded and exc_type is None and timeouts.task_timed_out():
                timeouts.raise_timeout()  # the body overran timeout_seconds: the task run ends timed out, as in Prefect

    def _exit(self, exc_type: type[BaseException] | None, exc: object = None) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        held, self._held = self._held, None
        if held is not None:
            renewer().release(held)
        led = get_ledger(self._ledger_arg)
        if (
            exc_type is not None
            and self.used < self.est
            and (issubclass(exc_type, TimeoutError) or not issubclass(exc_type, (Exception, GeneratorExit)))
        ):  # a timeout, CancelledError, Prefect's TerminationSignal, ^C
            # A timeout or cancellation stopped the body, maybe during an LLM call the provider bills anyway:
            # bill the estimate (at least what was reported), marked as billed by estimate.
            run_logger().warning(
                "lane gate: %s job %s was stopped (%s) with %d tokens reported; billing its "
                "estimate of %d (an interrupted call may still be billed by the provider)",
                self.stage,
                self.job_id,
                exc_type.__name__,
                self.used,
                self.est,
            )
            self._settle(led, held, self.est, "failed", by_estimate=True)
            return
        if exc_type is not None:  # what was reported; known short after a refused count (warned): as on success
            if isinstance(exc, BaseException):
                self._heard_provider(led, exc)  # a 429: the lane closes for everyone before the attempt settles
            short = self.meter.malformed
            self._settle(led, held, max(self.est, self.used) if short else self.used, "failed", by_estimate=short)
            return
        if self.meter.found and not self.meter.malformed:  # refused usage (warned): the count is short
            self._settle(led, held, self.used, "done")
            return
        bill = max(self.est, self.used)  # the estimate, or what was validly reported if more
        refused = self.meter.malformed
        if self.missing_usage == "fail":
            self._settle(led, held, bill, "failed", by_estimate=True)
            what = "had usage refused (warned above)" if refused else "returned no token usage and reported none"
            raise UsageMissing(
                f"stage {self.stage!r} (job {self.job_id}) {what}; billed {bill} tokens (its estimate, or what was "
                "validly reported if more). Return the LLM response, pass usage=, or call report_usage(n)",
                job_id=self.job_id,
            )
        log = run_logger()
        if refused:  # said every time: a refused count is news, not a habit of the task
            if self.used > self.est:
                how = f"what was validly reported, more than its estimate of {self.est}"
            else:
                how = f"its estimate; {self.used} validly reported"
            msg = "lane gate: %s job %s had usage refused (warned above); billing %d tokens (%s)"
            log.warning(msg, self.stage, self.job_id, bill, how)
        else:
            first = self._missing_key not in _missing_said
            _missing_said.add(self._missing_key)
            msg = "lane gate: %s job %s found no token usage (%s); billing its estimate of %d tokens%s"
            why = "no response with .usage returned, no report_usage call"
            once = " (said once per task; declare usage=NO_USAGE if it uses no tokens)" if first else ""
            (log.warning if first else log.debug)(msg, self.stage, self.job_id, why, bill, once)
        self._settle(led, held, bill, "done", by_estimate=True)

    async def __aexit__(self, *exc_info: Any) -> None:
        self.__exit__(*exc_info)

    def _settle(self, led: Ledger, held: Held | None, actual: int, outcome: str, by_estimate: bool = False) -> None:
        # ``actual`` is at most 10**12, which Ledger.settle accepts: the meter refuses usage past it where it is
        # given, and the estimate was checked at intake. The attempt is always settled, never left to be reaped.
        assert self.lease is not None, "only an admitted gate settles"
        with timeouts.shield():  # a timeout landing mid-transaction must not leave the attempt unbilled
            self.settled = led.settle(
                self._job,
                actual,
                attempt=self.lease.attempt,
                outcome=outcome,
                by_estimate=by_estimate,
                output=None if by_estimate or self.meter.malformed else self.meter.output,
            )
        tokenlog.settled(run_logger(), self.settled, stage=self.stage, est=self.est)
        if held is not None and held.lost:
            run_logger().error(
                "lane gate: %s job %s lost its lease while running; settled %d tokens late (billed, marked late)",
                self.stage,
                self.job_id,
                actual,
            )
            if led.job(self._job)["state"] == "new":  # reaped and requeued: nobody will run it now
                led.park(self._job, "lease lost while running; the Prefect task run already finished")


def gate(stage: str, estimate: Any, lane: str = "free", **options: Any) -> Gate:
    """Gate one block inside a task: ``with gate(...) as g: ...; g.report(resp)``.

    Options are those of :class:`Gate`. Works with ``with`` and ``async with``.

    Example:
        >>> with gate(stage="critique", estimate=1800, rate_cost=prompt + 2048, deadline=60) as g:  # doctest: +SKIP
        ...     g.report(client.chat.completions.create(..., max_tokens=2048))
    """
    check_estimate(estimate, of_arguments=False)
    check_rate_cost(options.get("rate_cost"), of_arguments=False)
    check_tenant(options.get("tenant"), of_arguments=False)
    return Gate(stage, estimate, lane, **options)


__all__ = ["Gate", "current_gate", "gate", "report_usage", "track_usage"]
