"""A process that forks one ``lane`` process per request, its third-party imports already done.

Run by :class:`tests.cli.lane_process.LaneProcesses`, never by hand. Each request (one JSON line on stdin)
becomes a forked child with the request's working directory, environment, argv, stdin and stdout/stderr
files, running ``lane_plugin.cli.main`` as the ``lane`` script would, then the interpreter's own exit steps
(non-daemon threads joined, ``atexit`` handlers run, streams flushed), and exiting with the script's code.
The server answers with the child's pid, then with its exit status.

What is imported here is only what does not read the environment when imported (the database and
validation libraries, the CLI framework); ``lane_plugin`` itself is imported fresh in each child, so every
setting it reads comes from the request's environment. The server holds no thread, connection or lock
across a fork.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import threading
import traceback

# Imported once here, so that no child pays for them; none reads the environment when imported (typer does).
PRELOAD = ("asyncio", "pydantic", "pydantic_settings", "sqlalchemy", "sqlmodel")


def _streams(stdin: str | None, out: str, err: str) -> None:
    for fd, path, flags in (
        (0, stdin or os.devnull, os.O_RDONLY),
        (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    # Fresh text streams on the new descriptors, as an interpreter started there would make them.
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)  # noqa: SIM115


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # sys.exit("message"): printed, status 1, as the interpreter does
    return 1


def _child(req: dict) -> None:
    code = 1
    try:
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        _streams(req.get("stdin"), req["out"], req["err"])
        sys.argv = [req["argv0"], *req["args"]]
        from lane_plugin.cli import main

        try:
            main()
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        threading._shutdown()  # the interpreter's exit: non-daemon threads joined, then atexit
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - an uncaught error ends a script with its traceback and status 1
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe: nothing more to say
                pass
        os._exit(code)


def serve() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # nothing but answers on the answer channel
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        answers.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    serve()
