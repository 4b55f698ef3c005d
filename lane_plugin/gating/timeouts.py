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

The body's shield is let go while a Prefect timeout scope opened inside the
body is open (a nested ``@task(timeout_seconds=...)``, ``prefect`` 's
``timeout()``): that scope's enforcer waits for the thread's shield before it
raises, and the scope's exit waits for its enforcer, so a shield held across it
would deadlock both (and the lease would be renewed for ever). While the
nested scope is open, the outer task's own timeout may land in the body too:
the attempt is then settled at its estimate, once, as for any interrupted body.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import operator
import signal
import sys
import threading
import time
from typing import Any


def shield():
    """Prefect's shield against its own timeout exceptions (deferred to the shield's end), if it has one."""
    try:
        asyncio.get_running_loop()
        return contextlib.nullcontext()  # async: cancellation only lands at an await, and settling awaits none
    except RuntimeError:
        pass
    thread_shield = own_shield()
    if thread_shield is None:
        return contextlib.nullcontext()
    return _thread_shield(thread_shield)


def own_shield() -> Any:
    """This thread's Prefect ``ThreadShield`` (None without one), looked up without Prefect's sweep of dead threads.

    Prefect's ``_get_thread_shield`` calls ``is_alive()`` on every thread it has a shield for, the main thread too.
    A timeout raised into this thread inside one of those calls makes CPython (bpo-45274's handling in
    ``Thread._wait_for_tstate_lock``) release that other thread's state lock and mark it stopped though it runs on;
    for the main thread every later shield lookup then fails (``KeyError``: 54 failed tests in one CI run, after a
    fault test's timeouts landed there). Here the map is read and, for a thread seen first, filled with one dict
    operation each, atomic under the GIL; Prefect's sweep only removes threads taken for dead.

    A thread's first lookup fills the map under Prefect's lock, as Prefect's own does: unlocked, it could race an
    enforcer's first lookup of the thread (Prefect checks, builds a shield, then stores it), which stored its own
    shield over this one and then took it and raised through the gate's (an outside review's forced thread switch).
    The lock is taken, the map filled and the lock let go by one C call (:func:`_fill_locked`): no bytecode runs
    while it is held, so no exception raised into this thread can leave it held (taking it in Python code, with a
    ``finally`` to let it go, did: tests/faults/test_thread_shield.py's injection at every line).
    """
    try:
        from prefect._internal.concurrency.cancellation import _THREAD_SHIELDS, ThreadShield
    except ImportError:  # pragma: no cover - a Prefect without it: nothing to defer
        return None
    me = threading.current_thread()
    if getattr(me, "_is_stopped", False):  # (Python 3.13 has no such mark, nor the fault that sets it)
        # threading takes this thread for a dead one (an exception raised into a Thread.is_alive() call on it, or a
        # dead thread whose ident it reuses): Prefect's enforcer finds no shield for it either
        return None
    shield = _THREAD_SHIELDS.get(me)
    if shield is None and type(me).__hash__ is object.__hash__ and type(me).__eq__ is object.__eq__:
        _fill_locked(_THREAD_SHIELDS, me, ThreadShield(me))
        shield = _THREAD_SHIELDS.get(me)
    if shield is None:  # Prefect's lock held past FILL_WAIT_SECONDS (left held by its own code), or a thread class
        # hashed by Python code (which could raise with the lock held): filled unlocked
        shield = _THREAD_SHIELDS.setdefault(me, ThreadShield(me))
    return shield


FILL_WAIT_SECONDS = 5.0


def _fill_locked(shields: dict, thread: threading.Thread, new: Any) -> None:
    """``shields.setdefault(thread, new)`` under Prefect's map lock, taken (for up to :data:`FILL_WAIT_SECONDS`)
    and let go inside one C call: ``takewhile`` stops the chain when the lock is not won, and the lock is let go
    only if it was. Every step is a C function (a blocking ``Lock.acquire``, ``dict.setdefault`` on a thread,
    hashed by identity, ``Lock.release``), called by ``operator.call``, which allocates nothing the garbage
    collector tracks: on Python 3.10 and 3.11 an allocation can run a collection, and with it finalizers' Python
    code, on the spot. Python 3.10 has no ``operator.call``: there each step's ``__call__`` is looked up (a
    method-wrapper allocated while the lock is held), so a finalizer may run inside; its exceptions are printed,
    never raised, so the lock is still let go."""
    from prefect._internal.concurrency.cancellation import _THREAD_SHIELDS_LOCK as lock

    steps = (
        functools.partial(lock.acquire, True, FILL_WAIT_SECONDS),
        functools.partial(shields.setdefault, thread, new),  # the shield (truthy): the chain goes on
        lock.release,
    )
    _record(itertools.takewhile(bool, map(_CALL, steps)))


@contextlib.contextmanager
def _thread_shield(shield: Any):
    """Prefect's ``shield()`` for a thread with no event loop, entered with :func:`enter_shield`."""
    enter_shield(shield)
    try:
        yield
    finally:
        shield.__exit__(None, None, None)  # (raises a timeout deferred by the shield, as Prefect's does)


def enter_shield(shield: Any) -> None:
    """Enter Prefect's ``ThreadShield`` of this thread without ever blocking inside its lock.

    The shield is a pure-Python ``threading._RLock``, and a timeout's enforcer holds it while it raises the timeout
    into this thread. A thread that blocked on the shield meanwhile won its inner lock the moment the enforcer let
    go, and the pending exception was raised right after, inside ``_RLock.acquire`` before it recorded its owner:
    the shield stayed locked for ever, and the next gated call of that thread (and every later enforcer of it) hung
    on it (issue 27's 120-run reproduction, one in a few runs of 120). Here the inner lock is only tried, with
    sleeps between: an exception set while the enforcer held it is raised in a sleep, before the try that wins.

    An exception raised into the thread by anything else (a signal handler's, or the fault tests' at any line) may
    still land right after the try that won: each try's outcome is recorded by the same C call that makes it (no
    bytecode between, so nothing can land between them), and a lock won but not yet recorded as this thread's is
    let go before the exception goes on. Left held, this thread's next shield spun for ever (CI, fault test).
    Such an exception landing once the shield is taken (as this returns, or in the caller before its cleanup is in
    place) still leaves it held by this thread: its own later shields re-enter it, but the count never comes back
    to 0 for an enforcer. Prefect's own timeouts never land there: their enforcer holds the shield.
    """
    lock = getattr(shield, "_lock", None)
    block = getattr(lock, "_block", None)
    if block is None or not hasattr(lock, "_owner"):  # pragma: no cover - another Prefect: its own entry
        shield.__enter__()
        return
    me = threading.get_ident()
    if lock._owner == me:
        lock._count += 1
        return
    won: list[bool] = []
    delay = 0.0002
    try:
        while True:
            _record(map(won.append, map(block.acquire, _NO_WAIT)))  # try the lock, and note the outcome: one C call
            if won[-1]:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
        lock._count = 1
        lock._owner = me
    except BaseException:
        if won and won[-1] and lock._owner != me:  # won, not yet recorded: as if never taken
            lock._count = 0
            block.release()
        raise


_NO_WAIT = (False,)
_CALL = getattr(operator, "call", operator.methodcaller("__call__"))  # Python 3.10 has no operator.call
_record = functools.partial(collections.deque, maxlen=0)  # runs an iterator to its end in C


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


class _BodyShields(threading.local):
    def __init__(self) -> None:
        self.held = 0  # body shields this thread holds now (not let go for a nested scope)
        self.shield: Any = None  # the shield they hold (this thread's)


_bodies = _BodyShields()


class BodyShield:
    """Prefect's shield held over a gated body in a worker thread, let go while a nested Prefect timeout scope
    is open in the same thread (see the module's docstring). Enter once, exit once (an ExitStack does)."""

    def __init__(self) -> None:
        self._shield: Any = None

    def __enter__(self) -> BodyShield:
        shield = own_shield()
        if shield is None:
            return self
        _install_nested_scope_hook()
        enter_shield(shield)
        self._shield = _bodies.shield = shield
        _bodies.held += 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        shield, self._shield = self._shield, None
        if shield is not None:
            _bodies.held -= 1
            shield.__exit__(*exc_info)


_hooked = False


def _install_nested_scope_hook() -> None:
    """Let a body's shield go while a Prefect ``WatcherThreadCancelScope`` opened inside it is open."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    try:
        from prefect._internal.concurrency.cancellation import WatcherThreadCancelScope
    except ImportError:  # pragma: no cover
        return
    enter, exit_ = WatcherThreadCancelScope.__enter__, WatcherThreadCancelScope.__exit__

    def __enter__(self):  # type: ignore[no-untyped-def]
        # The scope's enforcer thread is started (in ``enter``) while the body's shield still holds an outer timeout
        # back: on Python 3.11 a timeout sent while a thread starts one lands in the new thread, and the start waits
        # for ever (lane_plugin.ledger.spawn); the shield is let go once the enforcer runs.
        self._lane_suspended = 0
        try:
            result = enter(self)
            n = _bodies.held
            if n:
                shield = self._lane_shield = _bodies.shield
                self._lane_suspended, _bodies.held = n, 0  # first: the exit takes back what was let go
                for _ in range(n):
                    shield._lock.__exit__(None, None, None)  # the lock only: no deferred exception raised here
            return result
        except BaseException:
            # (an outer timeout let through as the shield went): the scope is closed, its enforcer joined, and the
            # shield taken back; left open, its enforcer would raise into this thread later, wherever it then is
            if getattr(self, "_started", False):
                try:
                    __exit__(self, *sys.exc_info())
                except Exception:  # noqa: BLE001 - the exception in flight is the one to raise
                    pass
            raise

    def __exit__(self, *exc_info):  # type: ignore[no-untyped-def]
        try:
            return exit_(self, *exc_info)
        finally:
            n = getattr(self, "_lane_suspended", 0)
            if n:
                self._lane_suspended = 0
                _take_back(self._lane_shield, n)

    def _take_back(shield: Any, n: int) -> None:
        # An outer timeout sent while the shield was let go (its enforcer waited for it) may land only now, in
        # enter_shield's wait (a loaded machine: seen in CI). It is raised once the shield is whole again: raised out
        # of the wait, it left the shield short of a hold, and the body shield's exit then failed the run with
        # "cannot release un-acquired lock" instead of ending it timed out.
        landed: BaseException | None = None
        taken = 0
        while taken < n:
            try:
                enter_shield(shield)
                taken += 1
            except BaseException as exc:  # noqa: BLE001 - raised below, once the shield is taken back
                landed = landed or exc
        _bodies.held += n
        if landed is not None:
            try:
                raise landed
            finally:
                landed = None  # (no frame cycle through the traceback)

    WatcherThreadCancelScope.__enter__ = __enter__  # type: ignore[method-assign]
    WatcherThreadCancelScope.__exit__ = __exit__  # type: ignore[method-assign]
