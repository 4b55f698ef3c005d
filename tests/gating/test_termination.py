"""Where the gate's SIGTERM handler goes, and where it does not (issue 22 item 3).

The handler's effect on a real hung process is in ``tests/faults/test_sigterm.py``; these check, in
this process, that it is installed only from the main thread, never over Prefect's ``TerminationSignal``
bridge, ``SIG_IGN`` or with ``LANE_SIGTERM_GRACE_SECONDS=0``, and that Prefect's flow engine still
installs its bridge over it for a run (so a cancellation is acknowledged) and puts it back afterwards.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from prefect.utilities.engine import _prefect_sigterm_handler, capture_sigterm, is_prefect_sigterm_handler_installed

from lane_plugin.gating import termination


@pytest.fixture
def fresh(monkeypatch) -> Iterator[None]:
    """SIGTERM at Python's default and the module as in a new process; both put back afterwards."""
    before = signal.getsignal(signal.SIGTERM)
    wakeup_before = signal.set_wakeup_fd(-1)
    for name, value in (
        ("_installed_in", None),
        ("_previous", None),
        ("_begun", threading.Lock()),
        ("_wakeup_write", None),
        ("_watching_in", None),
        ("_our_pipes", ()),
    ):
        monkeypatch.setattr(termination, name, value)
    monkeypatch.delenv("LANE_SIGTERM_GRACE_SECONDS", raising=False)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, before)
    signal.set_wakeup_fd(wakeup_before)
    if termination._wakeup_write is not None:
        os.close(termination._wakeup_write)  # its watcher reads the end of the pipe and stops


def test_installed_once_in_front_of_the_default(fresh):
    assert termination.install() is True
    assert signal.getsignal(signal.SIGTERM) is termination._on_sigterm
    assert termination._previous == signal.SIG_DFL
    assert termination._grace_seconds == 8.0
    assert termination.install() is True  # once: what it replaced stays the default
    assert termination._previous == signal.SIG_DFL


def test_the_watcher_sees_sigterm_behind_another_handler(fresh, monkeypatch):
    """Prefect's bridge in front of the gate's handler: the wakeup fd's watcher still starts the watchdog."""
    started = []
    monkeypatch.setattr(termination, "_watchdog", lambda signum, t0, grace: started.append((signum, grace)))
    assert termination.install() is True
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # someone else's handler, in front
    signal.raise_signal(signal.SIGTERM)
    end = time.monotonic() + 5
    while not started and time.monotonic() < end:
        time.sleep(0.01)
    assert started == [(signal.SIGTERM, 8.0)]


def test_the_watchdog_leaves_a_process_that_lives_on_alone(fresh, monkeypatch):
    """The main thread is not on its way out at the grace: no lease given back, no exit, watched again."""
    called = []
    monkeypatch.setattr(termination, "give_back_leases", lambda: called.append("give back"))
    monkeypatch.setattr(termination, "_force_exit", lambda grace, signum: called.append("exit"))
    assert termination._begun.acquire(blocking=False)
    termination._watchdog(signal.SIGTERM, time.monotonic(), 0.3)
    assert called == []
    assert termination._begun.acquire(blocking=False)  # released for the next SIGTERM


def test_the_watchdog_sees_the_main_thread_unwinding(fresh):
    """Asked from another thread while the main thread unwinds a SystemExit through a ``finally``."""
    seen = []
    checked = threading.Event()

    def look():
        time.sleep(0.2)
        seen.append(termination._exiting())
        checked.set()

    threading.Thread(target=look).start()
    with pytest.raises(SystemExit):
        try:
            raise SystemExit(0)
        finally:
            checked.wait(5)
    assert seen == [True]
    assert termination._exiting() is False


def test_a_wakeup_fd_in_use_is_left_alone(fresh):
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write)
    try:
        assert termination.install() is True  # the handler still goes in
        assert signal.set_wakeup_fd(write) == write  # the event loop's (say) fd is still the one
        assert termination._wakeup_write is None
    finally:
        signal.set_wakeup_fd(-1)
        os.close(read)
        os.close(write)


def test_not_from_another_thread(fresh):
    got = []
    t = threading.Thread(target=lambda: got.append(termination.install()))
    t.start()
    t.join()
    assert got == [False]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert termination.install() is True  # the main thread's next use installs it


@pytest.mark.parametrize("there", ["prefect", "ignored"])
def test_not_over_prefects_bridge_nor_sig_ign(fresh, there):
    handler = _prefect_sigterm_handler if there == "prefect" else signal.SIG_IGN
    signal.signal(signal.SIGTERM, handler)
    assert termination.install() is False
    assert signal.getsignal(signal.SIGTERM) is handler
    assert (termination._wakeup_write is not None) == (there == "prefect")  # a flow run under way: watched


def test_grace_zero_installs_nothing(fresh, monkeypatch):
    monkeypatch.setenv("LANE_SIGTERM_GRACE_SECONDS", "0")
    assert termination.install() is False
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_bad_grace_is_refused_naming_it(fresh, monkeypatch):
    from lane_plugin.errors import InvalidInput

    monkeypatch.setenv("LANE_SIGTERM_GRACE_SECONDS", "soon")
    with pytest.raises(InvalidInput, match="LANE_SIGTERM_GRACE_SECONDS"):
        termination.install()


def test_prefects_flow_engine_bridges_over_it_and_puts_it_back(fresh):
    assert termination.install() is True
    with capture_sigterm():  # what a flow run's engine does around the run
        assert is_prefect_sigterm_handler_installed()  # a runner's cancellation can still be acknowledged
        assert termination.install() is True  # a gate used during the run leaves Prefect's bridge alone
        assert signal.getsignal(signal.SIGTERM) is _prefect_sigterm_handler
    assert signal.getsignal(signal.SIGTERM) is termination._on_sigterm


def test_a_handler_it_replaced_is_called(fresh, monkeypatch):
    """No leases held: the signal goes straight on to the process's own handler."""
    seen = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    monkeypatch.setattr(termination, "_watchdog", lambda signum, t0, grace: None)  # not this test process
    assert termination.install() is True
    signal.raise_signal(signal.SIGTERM)
    assert seen == [signal.SIGTERM]
