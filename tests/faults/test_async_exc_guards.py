"""Issue 22: the once-per-process guards outside the gate's hot path survive an exception raised at any line.

Prefect raises a sync task's timeout into the task's thread (``PyThreadState_SetAsyncExc``) or, in the main
thread, from its alarm handler: either lands at the next bytecode that checks for it. A guard taken as a
Python-level lock (or a ``threading.Event``, whose ``set`` takes a ``Condition`` in Python code) is left held
when it lands right after the acquire returned. Two such guards were left:

- the tokenizer fallback's warn-once (:mod:`lane_plugin.estimators.tokens`): an ``Event`` set under a lock;
  left held, every later fallback count in the process waited for ever;
- the SIGTERM handler's install guard (:mod:`lane_plugin.gating.termination`): a lock acquired before its
  ``try``; left held, the handler was never installed in that process.

The SIGTERM watcher's and watchdog's thread starts (``install()``'s first call, and ``_arm`` in the handler) run in
the main thread too. Started with ``threading.Thread.start()``, an exception at its lines left
``threading._active_limbo_lock`` held with the thread half-registered in ``threading._limbo`` (3 points), then hung
the starter for good (the exception reached the new thread: see tests/faults/test_spawn.py); and ``_arm`` took its
guard before the start, so an exception between the two left no SIGTERM ever watched again.

Each test raises an exception at every line the guarded call runs (a trace function sets it on its own thread,
as test_async_exc.py does), proves it was raised, and asserts that the next call still does its work at once.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import lane_plugin
from lane_plugin.estimators import tokens

from .injection import in_files, injected

pytestmark = pytest.mark.timeout(300)

ROOT = Path(lane_plugin.__file__).parent


def _injected(call, at: int, files: tuple[str, ...]) -> tuple[bool, int, str | None]:
    """Run ``call`` with an exception raised into this thread at traced line ``at``: (raised, lines seen, where)."""
    return injected(call, at, in_files(*files))


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.n = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "characters / 4" in record.getMessage():
            self.n += 1


def _in_thread(fn, timeout: float) -> bool:
    """Run ``fn`` in a new daemon thread; True if it returned within ``timeout`` seconds."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive()


def _fallback() -> None:
    tokens._warn_fallback("o200k_base")


def test_the_tokenizer_fallback_warning_never_blocks_after_an_exception_at_any_line(monkeypatch):
    files = (tokens.__file__, threading.__file__)  # threading: an Event's set runs there
    counted = _Count()
    log = logging.getLogger("lane_plugin.estimators")
    log.addHandler(counted)
    try:
        monkeypatch.setattr(tokens, "_warn_turns", itertools.count())
        box: list = []
        assert _in_thread(lambda: box.append(_injected(_fallback, 10**9, files)), 5)
        lines = box[0][1]
        assert lines >= 2 and counted.n == 1, (lines, counted.n)  # the call's own lines, and it warned
        raised, blocked = [], []
        for at in range(1, lines + 1):
            monkeypatch.setattr(tokens, "_warn_turns", itertools.count())  # a fresh process's state
            counted.n, box = 0, []
            if not _in_thread(lambda box=box, at=at: box.append(_injected(_fallback, at, files)), 5):
                blocked.append((at, "the interrupted call itself hung"))
                break  # (before the fix: an Event's Condition left held, under the module's lock)
            if box[0][0]:
                raised.append(box[0][2])
            # the next fallback in the process (another thread) returns at once, whatever the first one left
            if not (_in_thread(_fallback, 1.0) and counted.n <= 1):
                blocked.append((at, box[0][2], counted.n))
                break
    finally:
        log.removeHandler(counted)
    print(f"tokenizer fallback warning: {lines} injection points, {len(raised)} raised inside the call")
    assert blocked == [], f"a fallback after an exception at these lines blocked or warned twice: {blocked}"
    assert len(raised) >= lines - 1, (raised, lines)  # the faults happened (the last may land after the call)


TERMINATION_SCRIPT = textwrap.dedent(
    """
    import json, signal, sys
    from tests.faults.test_async_exc_guards import _injected
    from lane_plugin.gating import termination as T

    def reset():  # the state of a process that has not installed the handler yet (the watcher stays)
        T._installed_in = None
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    assert T.install()  # sets the wakeup watcher up once: from here on each install runs the same lines
    reset()
    lines = _injected(T.install, 10**9, (T.__file__,))[1]
    raised, stuck = [], []
    for at in range(1, lines + 1):
        reset()
        hit, _, where = _injected(T.install, at, (T.__file__,))
        if hit:
            raised.append(where)
        if not (T.install() and signal.getsignal(signal.SIGTERM) is T._on_sigterm):
            stuck.append([at, where])
    reset()  # a gate in a signal handler that runs in the middle of install(): it leaves the install to it
    real, nested = signal.getsignal, []
    signal.getsignal = lambda signum: (nested.append(T.install()), real(signum))[1]
    outer = T.install()
    signal.getsignal = real
    print(json.dumps({"lines": lines, "raised": raised, "stuck": stuck, "reentry": [outer, nested]}))
    """
)


def test_the_sigterm_handler_is_installed_after_an_exception_at_any_line_of_install(tmp_path):
    """In a child process (install() changes its SIGTERM handler and wakeup fd), from its main thread."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    env.pop("LANE_SIGTERM_GRACE_SECONDS", None)
    out = subprocess.run(
        [sys.executable, "-c", TERMINATION_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    lines, raised, stuck = result["lines"], result["raised"], result["stuck"]
    print(f"termination.install: {lines} injection points, {len(raised)} raised inside the call")
    assert stuck == [], f"after an exception at these lines install() never installed the handler again: {stuck}"
    assert lines >= 8 and len(raised) >= lines - 1, result  # the faults happened
    assert result["reentry"] == [True, [False]], result  # re-entered, the inner call leaves it to the outer one


THREAD_START_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    from tests.faults.test_async_exc_guards import _injected
    from lane_plugin.gating import termination as T
    from lane_plugin.ledger import spawn

    FILES = (T.__file__, spawn.__file__, threading.__file__)
    GRACE = float(os.environ["LANE_SIGTERM_GRACE_SECONDS"])

    def fresh():  # a process that has not installed anything yet: no handler, no wakeup fd, no watcher
        T._installed_in = T._watching_in = None
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)

    def settled():  # the watchdog of an earlier SIGTERM has seen its grace out and let go of its guard
        end = time.monotonic() + GRACE + 3
        while time.monotonic() < end:
            if T._begun.acquire(blocking=False):
                T._begun.release()
                return True
            time.sleep(0.02)
        return False

    def limbo_lock_held():  # an RLock: held by this thread (re-entrant for it) or by another
        lock = threading._active_limbo_lock
        if lock._is_owned() or not lock.acquire(blocking=False):
            return True
        lock.release()
        return False

    def held():  # what an interrupted thread start or guard may have left behind
        time.sleep(0.05)  # (a thread being started registers within that)
        return [what for what, bad in (
            ("threading._active_limbo_lock", limbo_lock_held()),
            ("a thread half-registered in threading._limbo", bool(threading._limbo)),
            ("termination._begun", not settled()),
        ) if bad]

    def watchdog_starts(send):  # SIGTERM seen (by `send`): a watchdog starts within 2 s
        before = T._signal_at
        send()
        end = time.monotonic() + 2
        while T._signal_at == before and time.monotonic() < end:
            time.sleep(0.01)
        return T._signal_at != before and settled()

    def sigterm_behind_another_handler():  # only the wakeup fd's watcher can see this one
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        os.kill(os.getpid(), signal.SIGTERM)

    def arm():
        T._arm(signal.SIGTERM)

    result = {}
    for name, call, check in (
        ("install", T.install, lambda: T.install() and watchdog_starts(sigterm_behind_another_handler)),
        ("arm", arm, lambda: watchdog_starts(arm)),
    ):
        fresh()
        if name == "arm":
            assert T.install()
        lines = _injected(call, 10**9, FILES)[1]
        assert settled() and check(), name  # uninterrupted, it works
        raised, failed = [], []
        for at in range(1, lines + 1):
            if name == "install":
                fresh()
            hit, _, where = _injected(call, at, FILES)
            if hit:
                raised.append(where)
            left = held()
            if left or not check():
                failed.append([at, where, left])
        result[name] = {"lines": lines, "raised": raised, "failed": failed}
    print(json.dumps(result))
    """
)


def test_the_sigterm_threads_start_after_an_exception_at_any_line_of_their_start(tmp_path):
    """``install()`` (first use: the wakeup fd's watcher is set up) and ``_arm`` (the handler's watchdog) run in
    the main thread, where Prefect's alarm-based timeout raises at any bytecode. Raised at every line they run
    (with the thread start's own, in lane_plugin.ledger.spawn and threading), they leave no lock held and no
    thread half-started, and the next call sets the watcher up (it sees a SIGTERM behind another handler) or
    starts the watchdog."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")]),
        "LANE_SIGTERM_GRACE_SECONDS": "0.3",  # each watchdog started lets go of its guard after 0.3 s
    }
    out = subprocess.run(
        [sys.executable, "-c", THREAD_START_SCRIPT],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for name, r in result.items():
        print(f"termination {name}: {r['lines']} injection points, {len(r['raised'])} raised inside the call")
    for name, r in result.items():
        assert r["failed"] == [], f"{name}: after an exception at these lines, left held or not working: {r['failed']}"
        assert r["lines"] >= 10 and len(r["raised"]) >= r["lines"] - 1, (name, r)  # the faults happened


class _Quiet(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        pass


def _deliver_while_logging(log_call, handler: logging.Handler, until) -> tuple[int, int]:
    """Prefect's watcher-thread timeout delivery, at random moments, into a thread logging in a loop.

    The enforcer does what Prefect's ``WatcherThreadCancelScope.cancel`` does: it takes the thread's shield, then
    raises ``CancelledError`` into it (``_send_exception_to_thread``); it waits for each to be caught before the
    next. Returns (exceptions caught, times the handler's lock was left held by the logging thread) once
    ``until(caught, held)`` is true."""
    import random

    from prefect._internal.concurrency.cancellation import _get_thread_shield, _send_exception_to_thread

    state = {"caught": 0, "held": 0, "logging": False, "beats": 0, "restarts": 0}

    def logging_loop(stopped: threading.Event) -> None:  # each thread its own stop: a restart never revives one
        while not stopped.is_set():
            try:
                state["logging"] = True  # from here on an exception is caught below: the enforcer may send one
                while not stopped.is_set():
                    log_call("a message %s", 1)
                    state["beats"] += 1
            except BaseException:  # noqa: BLE001 - Prefect's CancelledError
                state["logging"] = False
                if handler.lock._is_owned():
                    state["held"] += 1
                    while handler.lock._is_owned():
                        handler.lock.release()
                state["caught"] += 1

    from prefect._internal.concurrency.cancellation import CancelledError

    # One at a time, each caught in the logging loop: not in the handling of the last one, nor in the thread's
    # exit (it would leave the dead thread in threading._active, and a new thread with its ident taken for it).
    def caught_all(sent: int) -> bool:
        end = time.monotonic() + 5
        while not (state["caught"] == sent and state["logging"]) and time.monotonic() < end:
            time.sleep(0)
        # Alive means still logging, read from the loop itself: on 3.11 threading's own is_alive() can be fooled
        # when an exception raised into a thread lands in its bookkeeping (CI at load: caught == sent, logging,
        # and is_alive() False).
        beats, end = state["beats"], time.monotonic() + 5
        while state["beats"] == beats and time.monotonic() < end:
            time.sleep(0.001)
        return state["caught"] == sent and state["beats"] != beats

    def start() -> tuple[threading.Thread, threading.Event]:
        state["logging"] = False
        stopped = threading.Event()
        thread = threading.Thread(target=logging_loop, args=(stopped,), daemon=True)
        thread.start()
        return thread, stopped

    def stop(thread: threading.Thread, stopped: threading.Event) -> None:
        stopped.set()
        thread.join(5)
        # join() returns at once for a thread threading takes for dead: stopped means it no longer beats
        beats, end = -1, time.monotonic() + 5
        while state["beats"] != beats and time.monotonic() < end:
            beats = state["beats"]
            time.sleep(0.05)
        assert state["beats"] == beats, "the logging thread never stopped"

    sent, (worker, stopped) = 0, start()
    try:
        while not until(state["caught"], state["held"]):
            assert caught_all(sent), (sent, state)
            time.sleep(random.random() * 0.002)
            try:
                thread_shield = _get_thread_shield(worker)
            except KeyError:
                # threading took the live worker for a dead one (the fooled is_alive() above): Prefect's enforcer
                # could not look its shield up either. A fresh logging thread carries on the count.
                stop(worker, stopped)
                worker, stopped = start()
                state["restarts"] += 1
                continue
            with thread_shield:
                _send_exception_to_thread(worker, CancelledError)
            sent += 1
        assert caught_all(sent), (sent, state)
    finally:
        stop(worker, stopped)  # never left logging in a loop for the rest of the session
    if state["restarts"]:
        print(f"the logging thread was started afresh {state['restarts']} times (threading took it for dead)")
    return state["caught"], state["held"]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="from 3.12 Handler.handle holds its lock in a `with`")
def test_a_prefect_timeout_never_leaves_a_logging_handlers_lock_held_by_a_gates_logger():
    """Python < 3.12's ``Handler.handle`` takes its lock before its ``try``: an exception landing as the acquire
    returns leaves it held, and every other thread logging through that handler then waits for ever. Shown first
    on a plain logger (until it happened, at most 60 s), then the gate's :class:`ShieldedLogger` takes as many
    timeouts, delivered as Prefect delivers them, and at least 300 (2,000 under LANE_FAULT_FULL=1), and never
    leaves it held."""
    from lane_plugin.gating.shielded_log import ShieldedLogger

    from .conftest import reps  # here: the child processes above import this module, and need no conftest

    handler = _Quiet()
    logger = logging.getLogger("lane_plugin.test_shielded_log")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        t0 = time.monotonic()
        plain, plain_held = _deliver_while_logging(
            logger.info, handler, lambda caught, held: held >= 1 or time.monotonic() - t0 > 60
        )
        assert plain_held >= 1, f"the fault never happened on a plain logger in {plain} timeouts"
        shielded, shielded_held = _deliver_while_logging(
            ShieldedLogger(logger).info, handler, lambda caught, held: caught >= max(plain, reps(300, 2000))
        )
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    print(
        f"timeouts into a logging thread: plain logger {plain_held} of {plain} left the handler's lock held; "
        f"the gate's shielded logger {shielded_held} of {shielded}"
    )
    assert shielded_held == 0
