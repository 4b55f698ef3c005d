"""Shared fixtures of the fault suite: isolated ledgers, worker processes, printed figures.

Repetition counts: ``reps(ci, full)`` returns ``full`` when ``LANE_FAULT_FULL=1``
(the documented full run, see README.md), else the modest CI count.
PostgreSQL tests skip with a reason when the server is unreachable, unless
``LANE_REQUIRE_POSTGRES=1`` (set by .ci/run), in which case they fail.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).parent
WORKER = HERE / "worker.py"
PG_BASE = os.environ.get("LANE_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
FULL = os.environ.get("LANE_FAULT_FULL") == "1"
FIGURES: list[str] = []
LATE: list = []

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def reps(ci: int, full: int) -> int:
    """How many repetitions: ``full`` under LANE_FAULT_FULL=1, else ``ci``."""
    return full if FULL else ci


def figure(line: str) -> None:
    """Print one figure now and again in the terminal summary."""
    FIGURES.append(line)
    print(f"\n[fault figure] {line}", flush=True)


def late_figure(make) -> None:
    """Register ``make() -> str | None``: a figure counted across several tests, said once at the end."""
    LATE.append(make)


def pytest_terminal_summary(terminalreporter):
    FIGURES.extend(line for line in (make() for make in LATE) if line)
    if FIGURES:
        terminalreporter.section(f"fault figures ({'full' if FULL else 'CI'} counts)")
        for line in FIGURES:
            terminalreporter.write_line(line)


def _libpq_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1).split("?", 1)[0]


def pg_admin():
    """A plain autocommit psycopg connection to the test database, or skip/fail."""
    import psycopg

    try:
        return psycopg.connect(_libpq_url(PG_BASE), autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        reason = f"PostgreSQL unreachable at {PG_BASE.split('@')[-1]}: {' '.join(str(exc).split())[:200]}"
        if os.environ.get("LANE_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason + " (LANE_REQUIRE_POSTGRES=1)")
        pytest.skip(reason)


# The PostgreSQL legs that start many ledger processes (marked ``pg_processes``) take turns, machine-wide: one
# such test at a time, its processes keeping PG_PROCESSES_POOL connections each, so that three xdist workers (or
# another suite on this machine) never run the server out of its connections (max_connections 100 here; one
# 8-process test with the default pool of 8 reached about 76).
PG_PROCESSES_LOCK = Path(tempfile.gettempdir()) / "lane-tests-pg-processes.lock"
PG_PROCESSES_POOL = "4"


@contextlib.contextmanager
def pg_processes_turn():
    """Hold the machine-wide turn of the many-process PostgreSQL tests (an ``flock``: a killed holder lets go)."""
    with open(PG_PROCESSES_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def pg_url(request, monkeypatch):
    """A ledger URL in a private schema f_<uuid>, dropped afterwards. Its sessions are named after the schema
    (``application_name``), so what the test left is found and ended by name."""
    schema = "f_" + uuid.uuid4().hex
    turn = contextlib.ExitStack()
    if request.node.get_closest_marker("pg_processes"):
        turn.enter_context(pg_processes_turn())
        monkeypatch.setenv("LANE_PG_POOL", PG_PROCESSES_POOL)  # this process's ledgers and the workers it spawns
    with turn:
        admin = pg_admin()
        admin.execute(f"create schema {schema}")
        sep = "&" if "?" in PG_BASE else "?"
        yield f"{PG_BASE}{sep}application_name={schema}&options=-csearch_path%3D{schema}"
        admin.close()
        _drop_schema(schema)


def _drop_schema(schema: str) -> None:
    for _ in range(30):  # the server may be restarting (test_db_restart)
        try:
            admin = pg_admin()
            admin.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity "
                "where pid <> pg_backend_pid() and (application_name = %s or query like %s)",
                (schema, f"%{schema}%"),
            )
            admin.execute(f"drop schema if exists {schema} cascade")
            admin.close()
            break
        except Exception:
            time.sleep(1)


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'ledger.db'}"


def make_lane(led, name: str = "free", **kw):
    """A lane whose only limit is the ceiling unless told otherwise."""
    settings = dict(
        allowance=kw.get("ceiling", 1000),
        ceiling=1000,
        start_fraction=1.0,
        burst_tokens=10**9,
        max_leased=64,
        lease_seconds=90.0,
        max_attempts=3,
    )
    settings.update(kw)
    settings.setdefault("allowance", settings["ceiling"])
    settings["allowance"] = max(settings["allowance"], settings["ceiling"])
    return led.set_lane(name, **settings)


def spawn(mode: str, *args, env: dict | None = None, **popen) -> subprocess.Popen:
    """Start ``worker.py MODE ARGS...`` as a separate OS process."""
    full_env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    full_env.update(env or {})
    return subprocess.Popen([sys.executable, str(WORKER), mode, *map(str, args)], env=full_env, **popen)


def wait_all(procs, timeout: float = 600) -> list[int]:
    end = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, end - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes


def read_json_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def counts(led) -> dict:
    """Row counts of every ledger table (a failed call must not change them)."""
    out = {}
    for table in ("lane", "job", "settlement", "tail", "shadow_estimate", "lane_run"):
        out[table] = led.rows(f"select count(*) from {table}")[1][0][0]
    return out


def assert_audit_clean(led, grace: float = 60.0) -> None:
    bad = led.audit(grace=grace)
    assert bad == [], "audit found violations:\n" + "\n".join(bad)
