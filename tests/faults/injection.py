"""Prefect's delivery of a timeout, by hand: an exception raised into a thread at a chosen line or bytecode.

Prefect raises a sync task's timeout (and cancellation) into the task's thread with ``PyThreadState_SetAsyncExc``:
the exception lands at the next bytecode that checks for one (after the call under way returns, a backward jump, a
function's start), whatever the thread runs then. :class:`Injector` is a trace function that does the same to its
own thread at the ``at``-th line (or bytecode) run in the files it traces, and :func:`run_injected` runs a call
under one. The fault tests count a call's lines first (``at`` past the end: nothing raised, ``seen`` is the count),
then inject at each point or at points spread over them.

Child processes import this module as ``tests.faults.injection`` (the repository's root on their ``PYTHONPATH``).
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

NEVER = 10**9  # an ``at`` past any call's end: the call runs whole, and ``seen`` counts its traced lines


class Injected(BaseException):
    """What the fault tests raise (a BaseException, as Prefect's CancelledError is)."""


def raise_in(ident: int, exc_type: type[BaseException] = Injected) -> None:
    """Set ``exc_type`` pending in thread ``ident``, as Prefect's timeout does (raised at its next check)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc_type))


class Injector:
    """A trace function raising :class:`Injected` into its own thread at the ``at``-th line run in a file ``traced``
    accepts (with ``opcodes=True``: before the ``at``-th bytecode).

    ``seen`` counts the lines (bytecodes) run so far; ``fired_at`` says where the exception was set: ``file:line``,
    ``function:line`` with ``where="function"``, ``function:line@offset`` with ``where="bytecode"``. Frames of other files are not
    traced locally (a call made from a traced file is traced again when it returns there)."""

    def __init__(self, at: int, traced: Callable[[str], bool], *, opcodes: bool = False, where: str = "file"):
        self.at, self.traced, self.opcodes, self.where = at, traced, opcodes, where
        self.seen, self.fired_at = 0, None
        self.landed: str | None = None  # (run_injected's landed_under)

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if not self.traced(frame.f_code.co_filename):
            return None
        if self.opcodes:
            frame.f_trace_opcodes = True
        if event == ("opcode" if self.opcodes else "line"):
            self.seen += 1
            if self.seen == self.at:
                code = frame.f_code
                name = Path(code.co_filename).name if self.where == "file" else code.co_name
                self.fired_at = f"{name}:{frame.f_lineno}" + (f"@{frame.f_lasti}" if self.where == "bytecode" else "")
                raise_in(threading.get_ident())
                sys.settrace(None)
                return None
        return self


def in_files(*files: str) -> Callable[[str], bool]:
    """``traced`` for these source files exactly."""
    chosen = frozenset(files)
    return chosen.__contains__


def under(*folders: str) -> Callable[[str], bool]:
    """``traced`` for every source file under these folders (each ending in a separator)."""
    return lambda filename: filename.startswith(folders)


def run_injected(call: Callable[[], Any], inj: Injector, *, errors: bool = False, landed_under: str = "") -> str:
    """Run ``call()`` in this thread under ``inj``: ``"raised"`` when :class:`Injected` landed inside it, else
    ``"returned"``. Any other exception is raised, or with ``errors=True`` an :class:`Exception` is told as
    ``"Type: message"``. A pending injection set at the call's last line is delivered here, inside the catch.

    The exception itself is never kept: its traceback holds the interrupted frames and, through their callers, the
    frame holding it (a cycle only the garbage collector breaks), and with them what the interrupted code had open,
    such as a connection it had just made. With ``landed_under`` (a folder), ``inj.landed`` is the deepest
    ``file:line`` under it that the exception went through."""
    try:
        sys.settrace(inj)
        try:
            call()
        finally:
            sys.settrace(None)
        for _ in range(3):
            time.sleep(0)
    except Injected as exc:
        if landed_under:
            tb = exc.__traceback__
            while tb is not None:
                if tb.tb_frame.f_code.co_filename.startswith(landed_under):
                    inj.landed = f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}"
                tb = tb.tb_next
            del tb
        return "raised"
    except Exception as exc:
        if not errors:
            raise
        return f"{type(exc).__name__}: {exc}"
    return "returned"


def injected(call: Callable[[], Any], at: int, traced: Callable[[str], bool]) -> tuple[bool, int, str | None]:
    """``call()`` with :class:`Injected` raised at traced line ``at``: (raised inside the call, lines seen, where it
    was set). Any other exception the call ends in is raised."""
    inj = Injector(at, traced)
    return run_injected(call, inj) == "raised", inj.seen, inj.fired_at


__all__ = ["NEVER", "Injected", "Injector", "in_files", "injected", "raise_in", "run_injected", "under"]
