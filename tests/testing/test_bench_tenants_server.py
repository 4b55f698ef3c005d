"""benchmarks/tenants_server.py: bench_tenants' Prefect server database (a fresh PostgreSQL database, dropped after
the run whatever happened) and the task runs read back from it."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from tests.conftest import postgres_or_skip

ROOT = Path(__file__).resolve().parents[2]


def tenants_server():
    spec = importlib.util.spec_from_file_location("tenants_server", ROOT / "benchmarks" / "tenants_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def databases(url: str) -> set[str]:
    import psycopg

    host, admin = url.split("://", 1)[1].split("/", 1)
    with psycopg.connect(f"postgresql://{host}/{admin.split('?')[0]}", autocommit=True) as c:
        return {row[0] for row in c.execute("select datname from pg_database where datname like 'bench_tenants_%'")}


def test_the_postgres_server_database_is_fresh_readable_and_dropped_even_when_the_run_fails(tmp_path):
    url = postgres_or_skip()
    ts = tenants_server()
    before = databases(url)
    with pytest.raises(RuntimeError, match="the run failed"):
        with ts.server_database(tmp_path, "postgres", url) as (env, read_url):
            name = read_url.rsplit("/", 1)[1]
            assert env["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://")
            assert env["PREFECT_API_DATABASE_CONNECTION_URL"].endswith(f"/{name}")
            assert databases(url) - before == {name}  # created for this run, on the URL's server
            import sqlalchemy as sa

            engine = sa.create_engine(read_url)
            with engine.begin() as c:  # the server's table as Prefect lays it out, enough of it to read back
                c.execute(
                    sa.text("create table task_run (flow_run_id uuid, created timestamptz, start_time timestamptz)")
                )
                c.execute(
                    sa.text(
                        "insert into task_run values ('00000000-0000-0000-0000-000000000001', "
                        "'2026-01-01 00:00:00+00', null)"
                    )
                )
            engine.dispose()
            runs = ts.prefect_task_runs(read_url)
            assert list(runs) == ["00000000-0000-0000-0000-000000000001"]
            created, started = runs["00000000-0000-0000-0000-000000000001"][0]
            assert created == 1767225600.0 and math.isnan(started)  # not started
            raise RuntimeError("the run failed")
    assert name not in databases(url)


def test_sqlite_is_a_file_in_the_run_directory_and_a_typo_is_refused(tmp_path):
    ts = tenants_server()
    with ts.server_database(tmp_path, "sqlite", "unused") as (env, read_url):
        assert env["PREFECT_API_DATABASE_CONNECTION_URL"] == f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}"
        assert read_url == f"sqlite:///{tmp_path / 'prefect.db'}"
    with pytest.raises(ValueError, match="--server-db: expected one of sqlite, postgres, got 'postgresql'"):
        with ts.server_database(tmp_path, "postgresql", "unused"):
            pass
