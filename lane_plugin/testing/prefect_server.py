"""A real ``prefect server start`` for tests and benchmarks: a subprocess on a free loopback port, its own PREFECT_HOME.

Example:
    >>> from lane_plugin.testing.prefect_server import real_server                # doctest: +SKIP
    >>> with real_server(tmp_path) as (api, env):                                  # doctest: +SKIP
    ...     subprocess.run([sys.executable, "flow.py"], env=env)   # env has PREFECT_API_URL=api

The server keeps its database (SQLite) under ``tmp_path``, has no analytics and (unless ``ui=True``) no UI,
and is started in its own process group, killed (TERM, then KILL) when the block ends. A server that exits or
is not healthy in time raises :class:`ServerNotHealthy` with the tail of its log (no pytest needed: the
benchmarks start one too).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent


class ServerNotHealthy(RuntimeError):
    """The Prefect server exited, or did not answer ``/health`` in time."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise ServerNotHealthy(f"prefect server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise ServerNotHealthy(f"prefect server not healthy after {timeout}s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen | None) -> None:
    """Kill a process group started with start_new_session: TERM, then KILL."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def server_env(tmp_path: Path, api: str, **extra: str) -> dict:
    """The environment of the server and of every process that talks to it."""
    home = tmp_path / "prefect-home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_PROFILES_PATH": str(home / "profiles.toml"),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}",
        "PREFECT_SERVER_UI_ENABLED": "false",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("PREFECT_API_KEY", None)
    env.update(extra)
    return env


@contextlib.contextmanager
def real_server(tmp_path: Path, *, ui: bool = False, **extra_env: str):
    """Start ``prefect server start``; yields ``(api_url, env)``; stops it afterwards.

    With ``ui``, the server serves its UI too, and the UI calls this server's API (``PREFECT_API_URL``
    in the server's environment: without it the UI calls port 4200, whatever port the server is on).
    """
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = server_env(tmp_path, api, **extra_env)
    if ui:
        env["PREFECT_SERVER_UI_ENABLED"] = "true"
    log = tmp_path / "server.log"
    server = None
    try:
        with log.open("w") as out:
            args = ["server", "start", "--host", "127.0.0.1", "--port", str(port), "--analytics-off"]
            args += [] if ui else ["--no-ui"]
            server = subprocess.Popen(
                [str(BIN / "prefect"), *args],
                env=env,
                cwd=tmp_path,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_healthy(api, server, log)
        yield api, env
    finally:
        stop(server)
