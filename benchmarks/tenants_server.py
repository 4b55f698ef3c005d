"""bench_tenants' Prefect server side: the server's database (SQLite or a fresh PostgreSQL database), its task runs
as the server recorded them, and a probe timing the server's answers from the interactive process.

    >>> with server_database(tmp, "postgres", "postgresql://root@127.0.0.1:5432/test") as (env, url):  # doctest: +SKIP
    ...     with real_server(tmp, **env) as (api, server_env): ...

``postgres`` creates a database of its own (``bench_tenants_<pid>_<hex>``) on the server of the given URL, points
``PREFECT_API_DATABASE_CONNECTION_URL`` at it (asyncpg, as a team deploying Prefect on PostgreSQL would), and
drops it when the block ends, whatever happened.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

SERVER_DBS = ("sqlite", "postgres")


def _base(url: str) -> tuple[str, str]:
    """``(scheme-less rest before the database, database)`` of a PostgreSQL URL of any driver."""
    rest = url.split("://", 1)[1]
    host, _, database = rest.partition("/")
    return host, database.split("?", 1)[0] or "postgres"


@contextlib.contextmanager
def server_database(tmp: Path, kind: str, pg_url: str) -> Iterator[tuple[dict[str, str], str]]:
    """Yields ``(environment for the server, a SQLAlchemy URL of the same database for reading it)``."""
    if kind == "sqlite":
        path = tmp / "prefect.db"
        yield {"PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{path}"}, f"sqlite:///{path}"
        return
    if kind != "postgres":
        raise ValueError(f"--server-db: expected one of {', '.join(SERVER_DBS)}, got {kind!r}")
    import psycopg

    host, admin_db = _base(pg_url)
    name = f"bench_tenants_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(f"postgresql://{host}/{admin_db}", autocommit=True) as c:
        c.execute(f'create database "{name}"')
    try:
        yield (
            {"PREFECT_API_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://{host}/{name}"},
            f"postgresql+psycopg://{host}/{name}",
        )
    finally:
        with psycopg.connect(f"postgresql://{host}/{admin_db}", autocommit=True) as c:
            c.execute(f'drop database if exists "{name}" with (force)')


def _epoch(value: object) -> float:
    if value is None:
        return math.nan
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    assert isinstance(value, dt.datetime)
    return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()


def prefect_task_runs(url: str) -> dict[str, list[tuple[float, float]]]:
    """The Prefect server's task runs per flow run: ``(created, start_time)`` epoch seconds."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            out: dict[str, list[tuple[float, float]]] = {}
            for flow_run, created, started in c.execute(
                sa.text("select flow_run_id, created, start_time from task_run")
            ):
                out.setdefault(str(flow_run), []).append((_epoch(created), _epoch(started)))
            return out
    finally:
        engine.dispose()


class ApiProbe:
    """A thread timing one small read of the server's database (``POST /flow_runs/filter``, limit 1) every
    ``every`` seconds from this process, with its own HTTP client: the server's answer time as any client sees
    it, apart from Prefect's client and this process's flow. ``samples`` are ``(wall time, seconds)``."""

    def __init__(self, api: str, every: float = 1.0) -> None:
        self.api, self.every = api, every
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="api-probe", daemon=True)

    def __enter__(self) -> ApiProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=60) as http:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    http.post(f"{self.api}/flow_runs/filter", json={"limit": 1}).raise_for_status()
                    self.samples.append((time.time(), time.monotonic() - t0))
                except httpx.HTTPError:
                    self.samples.append((time.time(), math.inf))
                self._stop.wait(max(0.0, self.every - (time.monotonic() - t0)))
