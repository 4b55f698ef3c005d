"""SIGTERM stops a gated process within its grace, with its leases given back.

A task stuck in its body (a hung call, a lock nobody will release) keeps a non-daemon thread alive, and
Python (and Prefect's task runner) waits for such threads: a handler that unwinds the main thread (Prefect's
``TerminationSignal`` bridge, an application's ``sys.exit``) then leaves a process that ignores SIGTERM,
its leases renewed for ever. So the first time the gate is used in a process's main thread
(:func:`install`, called by :func:`~lane_plugin.gating.get_ledger` and ``lane_task``), a SIGTERM handler
is installed in front of the one already there, and a thread watches Python's signal wakeup fd (Python's
C-level handler writes every signal to it, whichever Python handler is installed then).

On SIGTERM, with Python's default behind the gate's handler, the process is meant to end now: the handler
gives back every lease the process's renewer holds (from a daemon thread, for at most half the grace: an
unreachable ledger cannot hold the exit up), then ends the process by SIGTERM. Each lease is given back by
stopping its renewal and settling the attempt ``failed`` at its estimate, ``by_estimate``, as a body stopped
by a timeout or a cancellation is, one short transaction a lease: its reserve and ``max_leased`` slot are
free at once. With a Python handler behind it, or Prefect's bridge in front of it, that handler decides, and
a watchdog (started by the handler or the watcher, whichever sees the signal first) follows what the process
does: once it is on its way out (its main thread finished and Python is waiting for the others, or the main
thread is unwinding an exception no ``except Exception`` stops: ``TerminationSignal``, ``SystemExit``, ^C)
for a second, the leases still held are given back; still on its way out ``LANE_SIGTERM_GRACE_SECONDS``
(default 8) after the signal, the process is ended with ``os._exit(128 + SIGTERM)``. A process whose
handler chose to live on is left alone.

It is never installed over Prefect's own bridge (``prefect.utilities.engine.capture_sigterm`` checks that its
handler is the one installed to acknowledge a cancellation), nor over ``SIG_IGN`` or a handler set from C; a
later use of the gate tries again. Prefect's flow engine installs its bridge over this handler for a flow
run; its ``TerminationSignal`` unwinds the run through the task runner, which joins the task threads, so with
a task stuck it never gets to hand the signal back: the watcher is what sees SIGTERM then. The watcher is set
up only if nobody uses the wakeup fd (an asyncio loop with signal handlers in the main thread does; one set
later replaces it): without it the handler alone sees SIGTERM. On Python 3.10 (no
``sys._current_exceptions``) only a finished main thread counts as on its way out.
``LANE_SIGTERM_GRACE_SECONDS=0`` installs nothing.

Python runs a signal handler in the main thread between bytecodes: a main thread blocked in C code that
never returns (not a sleep, a join or a lock, which signals interrupt) delays the handler, not the watcher.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from ..ledger.spawn import Spawned, spawn
from ..settings import lane_settings

log = logging.getLogger("lane_plugin.termination")
_installed_in: int | None = None  # the pid whose main thread installed the handler
_previous: Any = None  # the handler it replaced
_grace_seconds = 8.0  # read at install: the handler must take no lock the interrupted main thread may hold
_begun = threading.Lock()  # taken once, by whichever sees SIGTERM first: the handler or the watcher
_signal_at = 0.0  # when the SIGTERM the running watchdog follows was seen
_wakeup_write: int | None = None  # the write end of the watcher's pipe (signal.set_wakeup_fd)
_watching_in: int | None = None  # the pid whose watcher was set up (or found the wakeup fd taken)
_our_pipes: tuple[int, ...] = ()  # write ends this module made wakeup fds, the last one current (see _watch_wakeups)


def install() -> bool:
    """Install the SIGTERM handler once per process, from its main thread; True if it is installed.

    Cheap after the first call. Does nothing (returns False, to be tried again on a later call) outside
    the main thread, over ``SIG_IGN`` or a handler set from C, and when ``LANE_SIGTERM_GRACE_SECONDS`` is 0;
    while Prefect's SIGTERM bridge is installed it sets up only the watcher.
    """
    global _installed_in, _previous, _grace_seconds
    pid = os.getpid()
    if _installed_in == pid:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    grace = float(lane_settings().sigterm_grace_seconds)
    if not hasattr(signal, "SIGTERM") or grace <= 0:
        return False
    if _reentered():  # a call this one interrupted is installing it (a signal handler's gate?)
        return False
    try:
        current = signal.getsignal(signal.SIGTERM)
        if current is None or current == signal.SIG_IGN:
            return False
        _grace_seconds = grace
        if _is_prefect_bridge(current):  # a flow run is under way: watch now, put the handler in later
            _watch_wakeups()
            return False
        if current is not _on_sigterm:  # (a forked child inherits it: it keeps what it replaced)
            _previous = current
            signal.signal(signal.SIGTERM, _on_sigterm)
        _watch_wakeups()
        _installed_in = pid
        return True
    except ValueError:  # not the main interpreter's main thread after all
        return False


def _reentered() -> bool:
    """True if :func:`install` is already running lower in this thread's stack (a signal handler's gate called it).

    Read from the stack, not kept in a lock or a flag: an exception raised into the main thread (Prefect's
    alarm-based timeout) right after a lock's acquire returned, or before a ``finally`` cleared a flag, would
    leave it set, and no later call in the process (or a forked child) would ever install the handler. Only the
    main thread gets this far, so re-entry is the one case to guard.
    """
    frame = sys._getframe(2)  # install's caller
    while frame is not None:
        if frame.f_code is install.__code__:
            return True
        frame = frame.f_back
    return False


def _is_prefect_bridge(handler: Any) -> bool:
    return (
        getattr(handler, "__module__", "") == "prefect.utilities.engine"
        and getattr(handler, "__name__", "") == "_prefect_sigterm_handler"
    )


def _watch_wakeups() -> None:
    """See SIGTERM the moment it arrives, whichever Python handler is installed then.

    Prefect's flow engine puts its own handler in front of this module's for a flow run, and its
    ``TerminationSignal`` unwinds the run through the task runner, which joins the task threads: a body
    that never returns holds it there, before Prefect hands the signal back. Python's C-level handler
    writes each signal's number to the wakeup fd whatever Python handler runs it, so a thread reading it
    starts the grace clock and gives the leases back meanwhile. Only when no one else uses the wakeup fd
    (an asyncio loop's signal handlers do): then the handler alone sees SIGTERM.

    Runs in the main thread, where Prefect's alarm-based timeout raises at any bytecode: the set-up counts as
    done only at its last line, so an interrupted one is redone by the next :func:`install`. Every pipe made is
    recorded first (one store of a new tuple), so the redo knows a wakeup fd left by it for its own and closes
    the ones it replaces (a reader started on one sees its end and stops). The reader is started with
    :func:`~lane_plugin.ledger.spawn.spawn`: ``threading.Thread.start`` takes Python-level locks and an event,
    and an exception landing in it can leave the thread in ``threading._limbo`` for good.
    """
    global _wakeup_write, _watching_in, _our_pipes
    pid = os.getpid()
    if _watching_in == pid:
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    _our_pipes = (*_our_pipes, write)
    try:
        old = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except (ValueError, OSError):
        _give_up_pipe(read, write)
        _watching_in = pid
        return
    if old != -1 and old not in _our_pipes:  # someone else's (one of ours is dead: set-up interrupted, or inherited)
        signal.set_wakeup_fd(old)
        _give_up_pipe(read, write)
        _watching_in = pid
        return
    spawn(Spawned("lane-sigterm-watch"), lambda: _read_wakeups(read))
    stale = [fd for fd in _our_pipes if fd != write]
    _our_pipes, _wakeup_write = (write,), write
    _watching_in = pid
    for fd in stale:
        _close(fd)


def _give_up_pipe(read: int, write: int) -> None:
    global _our_pipes
    _our_pipes = tuple(fd for fd in _our_pipes if fd != write)
    _close(read)
    _close(write)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:  # closed already (a set-up interrupted after it closed it)
        pass


def _read_wakeups(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 512)
        except OSError:
            return
        if not data:
            return
        if int(signal.SIGTERM) in data:
            _arm(int(signal.SIGTERM))


def _arm(signum: int) -> float:
    """SIGTERM seen (by the handler or the watcher): start the watchdog, unless it is running already.

    Returns when the signal was seen. In the main thread (the handler) Prefect's alarm-based timeout may raise
    at any bytecode: the ``_begun`` guard is taken by the new thread, never here, so an exception landing
    between taking it and starting the thread cannot leave it held (and no later SIGTERM watched), and the
    thread is started without ``threading.Thread.start``'s locks (see :func:`_watch_wakeups`).
    """
    t0 = time.monotonic()
    grace = _grace_seconds
    spawn(Spawned("lane-sigterm-grace"), lambda: _watch_once(signum, t0, grace))
    return t0


def _watch_once(signum: int, t0: float, grace: float) -> None:
    global _signal_at
    if not _begun.acquire(blocking=False):  # a watchdog already follows this SIGTERM (or an earlier one)
        return
    _signal_at = t0
    _watchdog(signum, t0, grace)


def _watchdog(signum: int, t0: float, grace: float) -> None:
    """Once the process is on its way out (see :func:`_exiting`), give back the leases still held (after a
    second: a gate the exception reaches settles its own); still on its way out at the grace, end it.
    A SIGTERM the process's handler chose to survive leaves it alone."""
    given = False
    while True:
        now = time.monotonic()
        exiting = _exiting()
        if exiting and not given and now >= t0 + min(1.0, grace / 4):
            give_back_leases()
            given = True
        if now >= t0 + grace:
            if exiting:
                _force_exit(grace, signum)
            _begun.release()  # it lives on: a later SIGTERM is watched again
            return
        time.sleep(0.05)


def _exiting() -> bool:
    """Is the process on its way out: its main thread finished (Python waits for the others at exit), or
    unwinding an exception no ``except Exception`` stops (``TerminationSignal``, ``SystemExit``, ^C)?"""
    main = threading.main_thread()
    if not main.is_alive():
        return True
    current = getattr(sys, "_current_exceptions", None)
    if current is None or main.ident is None:  # Python 3.10: only the handler's own path ends the process
        return False
    exc = current().get(main.ident)
    if isinstance(exc, tuple):  # Python 3.11: (type, value, traceback)
        exc = exc[1]
    return isinstance(exc, BaseException) and not isinstance(exc, Exception)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    previous = _previous
    if callable(previous):  # the process's own handler decides; the watchdog follows what it does
        _arm(signum)
        previous(signum, frame)
        return
    # Python's default: the process ends now, so its leases are given back first (for half the grace at most)
    t0 = _arm(signum)
    releaser = Spawned("lane-sigterm-release")
    spawn(releaser, give_back_leases)
    releaser.join(max(0.0, t0 + _grace_seconds / 2 - time.monotonic()))
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _force_exit(grace: float, signum: int) -> None:
    # os.write, not logging: a thread stopped while holding a logging handler's lock must not hold up the exit
    msg = f"lane: the process did not exit within {grace:g}s of SIGTERM (LANE_SIGTERM_GRACE_SECONDS); forcing it\n"
    try:
        os.write(2, msg.encode())
    except OSError:
        pass
    os._exit(128 + signum)


def give_back_leases() -> int:
    """Settle every lease this process's renewer keeps alive, at its estimate; returns how many were settled.

    Runs without taking the renewer's lock (a thread interrupted while holding it must not hold this up):
    each lease's renewal is stopped by pushing its next renewal out of reach, then the attempt is settled
    ``failed`` at its estimate, ``by_estimate``. A lease that cannot be settled (ledger unreachable, already
    settled) is logged and left to expire; it is no longer renewed.
    """
    from .renewal import renewer

    held = [h for h in _snapshot(renewer()) if h.renew_at != float("inf")]  # not given back already
    done = 0
    for h in held:
        h.renew_at = float("inf")
    for h in held:
        lease: Any = h.lease
        try:
            h.ledger.settle(  # type: ignore[attr-defined]
                lease.job_id,
                int(lease.est),
                attempt=lease.attempt,
                outcome="failed",
                by_estimate=True,
            )
            done += 1
            log.warning(
                "lane: SIGTERM: gave back the lease of %s job %s (attempt %d), billed its estimate of %d",
                lease.stage,
                lease.job_id,
                lease.attempt,
                lease.est,
            )
        except Exception as exc:
            log.error(
                "lane: SIGTERM: could not give back the lease of job %s (%s: %s); it expires unrenewed",
                lease.job_id,
                type(exc).__name__,
                exc,
            )
    return done


def _snapshot(r: Any) -> list[Any]:
    for _ in range(100):
        try:
            return list(r._held)
        except RuntimeError:  # the set changed size while being copied: copy again
            continue
    return []


__all__ = ["give_back_leases", "install"]
