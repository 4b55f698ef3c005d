"""One Prefect test server for the whole session, and a fresh ledger per test.

``prefect_test_harness`` starts a server subprocess (~9 s): it is started once,
lazily, by the first test that asks for ``prefect_server``. Each test gets its
own SQLite ledger through ``LANE_DATABASE_URL``; the gate keeps one
:class:`~lane_plugin.Ledger` per URL, so a new URL is a new ledger.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    """The ledger the gate uses in this test (a fresh SQLite file); audited afterwards."""
    from lane_plugin.gate import get_ledger

    url = f"sqlite:///{tmp_path / 'lane.db'}"
    monkeypatch.setenv("LANE_DATABASE_URL", url)
    led = get_ledger(url)
    yield led
    led.close()


def job_rows(ledger, where: str = "1 = 1", params: dict | None = None) -> list[dict]:
    cols, rows = ledger.rows(f"select * from job where {where} order by created_at, id", params)
    return [dict(zip(cols, r)) for r in rows]


def settlements(ledger) -> list[dict]:
    cols, rows = ledger.rows("select * from settlement order by settled_at, job_id, attempt")
    return [dict(zip(cols, r)) for r in rows]
