"""Issue 22: the once-per-process guards outside the gate's hot path survive an exception raised at any line.

Prefect raises a sync task's timeout into the task's thread (``PyThreadState_SetAsyncExc``) or, in the main
thread, from its alarm handler: either lands at the next bytecode that checks for it. A guard taken as a
Python-level lock (or a ``threading.Event``, whose ``set`` takes a ``Condition`` in Python code) is left held
when it lands right after the acquire returned. Two such guards were left:

- the tokenizer fallback's warn-once (:mod:`lane_plugin.estimators.tokens`): an ``Event`` set under a lock;
  left held, every later fallback count in the process waited for ever;
- the SIGTERM handler's install guard (:mod:`lane_plugin.gating.termination`): a lock acquired before its
  ``try``; left held, the handler was never installed in that process.

Each test raises an exception at every line the guarded call runs (a trace function sets it on its own thread,
as test_async_exc.py does), proves it was raised, and asserts that the next call still does its work at once.
"""

from __future__ import annotations

import ctypes
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

pytestmark = pytest.mark.timeout(300)

ROOT = Path(lane_plugin.__file__).parent


class Injected(BaseException):
    """What the test raises into the thread (a BaseException, as Prefect's CancelledError is)."""


class Injector:
    """A trace function that raises :class:`Injected` into its own thread at the ``at``-th line run in ``files``."""

    def __init__(self, at: int, files: tuple[str, ...]):
        self.at, self.files, self.seen, self.fired_at = at, files, 0, None

    def __call__(self, frame, event, arg):
        if event == "line" and frame.f_code.co_filename in self.files:
            self.seen += 1
            if self.seen == self.at:
                self.fired_at = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(threading.get_ident()), ctypes.py_object(Injected)
                )
                sys.settrace(None)
                return None
        return self


def _injected(call, at: int, files: tuple[str, ...]) -> tuple[bool, int, str | None]:
    """Run ``call`` with an exception raised into this thread at traced line ``at``: (raised, lines seen, where)."""
    inj = Injector(at, files)
    raised = False
    try:
        sys.settrace(inj)
        try:
            call()
        finally:
            sys.settrace(None)
        for _ in range(3):  # a check that delivers one set at the call's last line
            time.sleep(0)
    except Injected:
        raised = True
    return raised, inj.seen, inj.fired_at


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
    sys.path.insert(0, sys.argv[1])
    from test_async_exc_guards import _injected
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
        [sys.executable, "-c", TERMINATION_SCRIPT, str(Path(__file__).parent)],
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
