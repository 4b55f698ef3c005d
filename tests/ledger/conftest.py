"""Fixtures the ledger tests share."""

import pytest

from lane_plugin import Ledger


@pytest.fixture
def led(ledger_url, clock):
    """A ledger on the parametrised database (SQLite, PostgreSQL) with the injected clock."""
    ledger = Ledger(ledger_url, clock=clock)
    yield ledger
    ledger.close()
