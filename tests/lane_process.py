"""``lane`` run as its own process, from a fork server that has already paid for the heavy imports.

The CLI tests start ``lane`` some hundreds of times; each start spent most of its second of CPU importing
SQLAlchemy, SQLModel and pydantic, the suite's largest single cost (tests/README.md has the figures). A child forked from ``forkserver.py`` is still a process of
its own (its own environment, working directory, argv, standard streams, exit status and atexit), and it
imports ``lane_plugin`` itself afresh, but it skips those imports. What it does not exercise, the console
script's shim and the interpreter's start, the tests that run ``lane`` on a pseudo-terminal and the README's
and docs' command tests still do, by ``exec``; ``LANE_CLI_EXEC=1`` makes :func:`run_lane` exec every one.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVER = Path(__file__).with_name("forkserver.py")
LANE = str(Path(sys.executable).with_name("lane"))
EXEC = os.environ.get("LANE_CLI_EXEC") == "1"  # every `lane` by exec, as a shell starts it: rules the server out
# This test process's fork servers by (argv0, *preload), each started at its first call.
_servers: dict[tuple[str, ...], LaneProcesses] = {}


def _server(argv0: str, preload: tuple[str, ...] = ()) -> LaneProcesses:
    key = (argv0, *preload)
    if key not in _servers:
        _servers[key] = LaneProcesses(argv0, preload)
        atexit.register(_servers[key].close)
    return _servers[key]


def run_lane(args: list[str], *, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    """``subprocess.run([lane, *args], capture_output=True, text=True, env=env, timeout=timeout)``, forked."""
    if EXEC:
        return subprocess.run([LANE, *args], capture_output=True, text=True, env=env, timeout=timeout)
    return _server(LANE).run([str(a) for a in args], env=env, timeout=timeout)


def run_python(code: str, *, preload: tuple[str, ...] = (), timeout: float = 60) -> subprocess.CompletedProcess:
    """``subprocess.run([python, "-c", code], capture_output=True, text=True)`` in this process's environment,
    forked from a server that has imported ``preload`` (never ``lane_plugin``) already."""
    if EXEC:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    return _server(sys.executable, preload).run([], code=code, env=dict(os.environ), timeout=timeout)


class LaneProcesses:
    """One fork server; :meth:`run` is ``subprocess.run(["lane", *args], capture_output=True, text=True)``."""

    def __init__(self, argv0: str, preload: tuple[str, ...] = ()):
        self.argv0 = argv0
        self.server = subprocess.Popen(
            [sys.executable, str(SERVER), *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.scratch = Path(tempfile.mkdtemp(prefix="lane-forks-"))

    def _answer(self, deadline: float) -> dict:
        out = self.server.stdout
        while not select.select([out], [], [], max(0.0, deadline - time.monotonic()))[0]:
            if time.monotonic() >= deadline:
                raise TimeoutError
        line = out.readline()
        if not line:
            raise RuntimeError(f"the lane fork server ended (exit {self.server.poll()})")
        return json.loads(line)

    def run(
        self,
        args: list[str],
        *,
        env: dict,
        timeout: float = 60,
        cwd: str | None = None,
        input: str | None = None,
        code: str | None = None,
    ):
        out, err, stdin = (self.scratch / name for name in ("out", "err", "in"))
        if input is not None:
            stdin.write_text(input)
        request = {
            "argv0": self.argv0,
            "args": [str(a) for a in args],
            "env": dict(env),
            "cwd": cwd or os.getcwd(),
            "out": str(out),
            "err": str(err),
            "stdin": str(stdin) if input is not None else None,
        }
        if code is not None:
            request["code"] = code
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        deadline = time.monotonic() + timeout
        pid = self._answer(deadline)["pid"]
        try:
            status = self._answer(deadline)["status"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self._answer(time.monotonic() + 10)
            raise subprocess.TimeoutExpired([self.argv0, *args], timeout) from None
        read = lambda p: p.read_text(errors="backslashreplace")  # noqa: E731
        return subprocess.CompletedProcess([self.argv0, *args], status, read(out), read(err))

    def close(self) -> None:
        self.server.stdin.close()
        try:
            self.server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        for p in self.scratch.iterdir():
            p.unlink()
        self.scratch.rmdir()
