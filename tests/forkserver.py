"""A process that forks one ``lane`` process per request, its third-party imports already done.

Run by :class:`tests.lane_process.LaneProcesses`, never by hand. Each request (one JSON line on stdin)
becomes a forked child with the request's working directory, environment, argv, stdin and stdout/stderr
files, running ``lane_plugin.cli.main`` as the ``lane`` script would, then the interpreter's own exit steps
(non-daemon threads joined, ``atexit`` handlers run, objects finalized, streams flushed), exiting with the
script's code.
A request with ``code`` in place of ``args`` runs that Python source as ``python -c`` would (the import checks of
``tests/gating/test_exports.py``). The server answers with the child's pid, then with its exit status.

What is imported here is only what does not read the environment when imported (asyncio, the database and
validation libraries; not typer, which does), and what the server's own arguments name (Prefect's parts, for the
``code`` requests, which run in the test's own environment). ``lane_plugin`` itself is imported fresh in each
child, so every setting it reads comes from the request's environment and every import order inside it is its
own. The server holds no thread, connection or lock across a fork.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
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


def _child(req: dict) -> None:
    """Become the ``lane`` process ``req`` asks for; never returns. The exit is the interpreter's own, as the
    console script's ``sys.exit(main())``: an uncaught error printed with its traceback and status 1,
    non-daemon threads joined, ``atexit`` handlers run, objects finalized (a SQLite connection closed, its WAL
    file removed), streams flushed."""
    try:
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        _streams(req.get("stdin"), req["out"], req["err"])
        sys.argv = ["-c"] if "code" in req else [req["argv0"], *req["args"]]
    except BaseException:  # noqa: BLE001 - the request could not be set up: say why, as a failed start would
        traceback.print_exc()
        os._exit(1)
    if "code" in req:
        exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__"})  # an error exits 1, with its traceback
        sys.exit(0)
    from lane_plugin.cli import main

    sys.exit(main())


def serve() -> None:
    for name in (*PRELOAD, *sys.argv[1:]):
        importlib.import_module(name)
    assert not [m for m in sys.modules if m.split(".")[0] == "lane_plugin"], "a preload imported lane_plugin"
    gc.freeze()  # the preloaded objects out of the children's collections: they would touch (copy) every page
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
