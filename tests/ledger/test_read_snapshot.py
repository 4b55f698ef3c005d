"""A read (``lane status``, ``lanes``, the audit) sees the ledger at one instant, on both databases.

PostgreSQL's default READ COMMITTED gives every statement its own snapshot: a tick committed between
two of a read's queries showed up in one and not the other (jobs counted waiting that the lane row
already counted leased). Reads run at REPEATABLE READ, read-only, there; SQLite's WAL read transaction
is one snapshot already.
"""

from __future__ import annotations

import pytest

from lane_plugin import Ledger
from lane_plugin.errors import LaneError
from lane_plugin.ledger import status


@pytest.fixture
def other(ledger_url, clock):
    """A second process's ledger on the same database."""
    ledger = Ledger(ledger_url, clock=clock)
    yield ledger
    ledger.close()


def test_lane_status_is_one_snapshot_when_a_tick_commits_between_its_queries(led, other, monkeypatch):
    led.set_lane("a", allowance=10**6, ceiling=10**6, burst_tokens=10**5, max_leased=10)
    for _ in range(3):
        led.submit("s", 100, "a")
    ticked = []
    read_lanes = status.all_lanes

    def tick_then_read(cur):  # status has counted the waiting jobs; now another process leases them
        if not ticked:
            ticked.append(other.tick("a"))
        return read_lanes(cur)

    monkeypatch.setattr(status, "all_lanes", tick_then_read)
    row = next(r for r in led.lanes() if r["lane"] == "a")
    assert len(ticked[0]) == 3, "the tick committed its 3 leases between status's queries"
    assert (row["waiting"], row["leased"], row["reserved"]) == (3, 0, 0)
    monkeypatch.undo()
    row = next(r for r in led.lanes() if r["lane"] == "a")
    assert (row["waiting"], row["leased"], row["reserved"]) == (0, 3, 300)


def test_a_read_transaction_cannot_write_on_postgresql(pg_url):
    """What runs as a read is kept read-only by the database, so a read path that started writing fails in
    the PostgreSQL tests instead of writing outside the snapshot. (SQLite's read transactions are not
    read-only; only Ledger.rows sets query_only.)"""
    led = Ledger(pg_url)
    try:
        with pytest.raises(LaneError, match="read-only"):
            led.db.transaction(lambda cur: cur.execute("update lane set stopped = stopped"), write=False)
        led.db.transaction(lambda cur: cur.execute("update lane set stopped = stopped"))  # a write transaction writes
    finally:
        led.close()
