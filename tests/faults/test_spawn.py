"""A timeout raised into a gated thread while it starts a helper thread never hangs anything.

``PyThreadState_SetAsyncExc(ident)`` (how Prefect delivers a sync task's timeout to its worker thread) sets the
exception on the first thread state with that ident, and a thread being started carries its creator's ident until
its OS thread runs: a timeout sent in that window lands in the NEW thread, at its first bytecode. With
``threading.Thread.start()`` the new thread dies before it sets its ``_started`` event and the starter waits on it for
ever: the wake-up watcher's start was seen hung so in a 360-run PostgreSQL timeout storm (a gated thread in
``Thread.start()`` of ``Wakeups._start_watcher``). With Prefect's delivery at random (tests/faults/start_storm.py: a
thread raising into a thread that loops starting threads, at a random moment of each start) ``Thread.start()`` hung
within 3 to 20 starts on a 2-core machine; :func:`~lane_plugin.ledger.spawn.spawn` ran 5,000 rounds with no hang,
every thread ran, and 4,975 of the exceptions surfaced in the starter (the rest landed after its start returned).

Here the window is made certain: the new thread's C entry first sets the exception on its own state (C calls
only: ``itertools``' ``starmap`` of ``ctypes``' ``PyThreadState_SetAsyncExc``), so it is pending before the thread
runs any bytecode, as a timeout sent in the window is. The fault is shown first on ``threading.Thread.start()``
(the starter still waits after 1 s, in ``Event.wait``); then the gate's helper threads (the wake-up watcher and the
lease renewer, :func:`lane_plugin.ledger.spawn.spawn`): the starter gets the exception back (raised in the call that
started the thread, as if it had landed there), the helper thread runs, and a gated call afterwards runs at once.
"""

from __future__ import annotations

import _thread
import collections
import ctypes
import itertools
import sys
import threading
import time
import traceback
from types import SimpleNamespace

import pytest

from lane_plugin.gating import gate
from lane_plugin.gating.renewal import renewer
from lane_plugin.ledger import Ledger
from lane_plugin.ledger import spawn as spawn_mod

from .conftest import figure, make_lane

pytestmark = pytest.mark.timeout(120)


class Injected(BaseException):
    """What the test raises (a BaseException, as Prefect's CancelledError is)."""


# its own prototype (ctypes.pythonapi's is shared: Prefect calls it with a c_long)
_SET = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)


def _raising_first(entry_args: collections.abc.Iterable) -> collections.abc.Iterator:
    """An iterator that, consumed in the new thread, sets :class:`Injected` on that thread's own state with C calls
    only (no bytecode: nothing can raise it yet), then yields ``entry_args``' items."""
    own = zip(iter(_thread.get_ident, None), [Injected])
    return itertools.chain(itertools.filterfalse(None, itertools.starmap(_SET, own)), entry_args)


def _start_new_thread_raising_first(fn, args, *rest):
    """``_thread.start_new_thread`` whose new thread has an exception pending before its first bytecode."""
    if fn is collections.deque:  # spawn's C entry: deque(generator, 0)
        return _thread.start_new_thread(collections.deque, (_raising_first(args[0]), 0))
    # threading's: fn() (Thread._bootstrap), run from C after the exception is set
    return _thread.start_new_thread(collections.deque, (_raising_first(itertools.starmap(fn, [args])), 0))


def _stack_of(ident: int) -> str:
    frame = sys._current_frames().get(ident)
    return "".join(traceback.format_stack(frame)[-3:]) if frame is not None else "(gone)"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (the new thread dies of it)
def test_thread_start_hangs_when_the_exception_reaches_the_new_thread(monkeypatch):
    """The fault: a helper started with threading.Thread.start() while an exception for the starter is pending in
    the new thread's state: the starter waits for ever."""
    monkeypatch.setattr(threading, "_start_new_thread", _start_new_thread_raising_first)
    ran, returned = [], []
    helper = threading.Thread(target=lambda: ran.append(1), daemon=True)

    def starter():
        helper.start()
        returned.append(True)

    ident = _thread.start_new_thread(starter, ())
    time.sleep(1.0)
    stack = _stack_of(ident)
    monkeypatch.undo()
    try:
        assert not returned and not ran, "the start returned: the fault was not reproduced"
        assert "in wait" in stack and "in start" in stack, stack
        figure(f"Thread.start() with the starter's exception in the new thread: still waiting after 1 s in\n{stack}")
    finally:
        helper._started.set()  # (releases the stuck starter: its thread ends)


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_the_gates_helper_threads_start_and_hand_the_exception_back(db, request, monkeypatch):
    """The wake-up watcher and the lease renewer started while an exception for the starter reaches the new thread:
    the starter raises it within 1 s (in the start call), the helper runs, and a gated call afterwards runs."""
    led = Ledger(request.getfixturevalue("sqlite_url" if db == "sqlite" else "pg_url"))
    make_lane(led, ceiling=10**6, lease_seconds=3.0)
    try:
        with gate(stage="warm", estimate=10, ledger=led, key="warm") as g:  # schema, threads and connections up
            g.report(5)
        wakeups, ren = led.wakeups, renewer()
        shim = SimpleNamespace(
            start_new_thread=_start_new_thread_raising_first,
            allocate_lock=_thread.allocate_lock,
            get_ident=_thread.get_ident,
        )
        figures = []
        for name, start, record in (
            ("wake-up watcher", wakeups._start_watcher, lambda: wakeups._thread),
            ("lease renewer", ren._start, lambda: ren._thread),
        ):
            monkeypatch.setattr(spawn_mod, "_thread", shim)
            got = []
            t0 = time.monotonic()
            try:
                start()
            except Injected:
                got.append(time.monotonic() - t0)
            finally:
                monkeypatch.undo()
            me = record()
            assert got, f"{name}: the exception meant for the starter was lost"  # the fault happened, and came back
            assert got[0] < 1.0, (name, got)
            for _ in range(100):  # the helper runs (it was not killed by the exception)
                if me.began:
                    break
                time.sleep(0.01)
            assert me.began and me.is_alive(), (name, me.began, me.done)
            figures.append(f"{name}: raised in the starter after {got[0] * 1000:.1f} ms, thread running")
        # nothing blocks afterwards: a gated call (registering with the watcher, held by the renewer) runs at once
        t0 = time.monotonic()
        with gate(stage="after", estimate=10, ledger=led, key="after") as g:
            g.report(7)
        took = time.monotonic() - t0
        assert g.settled.actual == 7 and took < 1.0, took
        figure(
            f"helper starts with the starter's exception in the new thread ({db}): {'; '.join(figures)}; "
            f"next gated call {took * 1000:.0f} ms"
        )
    finally:
        led.close()
