"""The cursor the ledger's transactions speak through (``:name`` parameters on both databases), what they
cost (:class:`Stats`), and the database server's clock they read (:class:`DatabaseClock`)."""

from __future__ import annotations

import re
import time
from collections import deque
from functools import lru_cache

from . import queries

_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@lru_cache(maxsize=512)
def _pyformat(sql: str) -> str:
    """``:name`` placeholders to psycopg's ``%(name)s``."""
    return _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))


class Stats:
    """What this process's transactions cost: commits, how long writers waited for a lane's lock
    (``BEGIN IMMEDIATE`` on SQLite, the lane row's ``FOR UPDATE`` on PostgreSQL: one sample per
    transaction, its first lock; a re-lock of a row the transaction holds cannot wait and is not a
    sample), and how long they held it (from getting it to the end of the commit). For benchmarks."""

    def __init__(self):
        self.commits = self.writes = self.busy = 0
        self.lock_waits: deque[float] = deque(maxlen=500_000)
        self.lock_holds: deque[float] = deque(maxlen=500_000)

    def snapshot(self) -> dict:
        return {
            "commits": self.commits,
            "writes": self.writes,
            "busy": self.busy,
            "lock_waits": list(self.lock_waits),
            "lock_holds": list(self.lock_holds),
        }


class Cursor:
    """A thin cursor speaking ``:name`` parameters on both databases."""

    def __init__(self, raw, dialect: str, clock: DatabaseClock | None = None, stats: Stats | None = None):
        self.raw = raw
        self.dialect = dialect
        self.clock = clock
        self.stats = stats
        self.locked_at: float | None = None  # when this transaction first got a lane's lock (perf_counter)

    def execute(self, sql: str, params: dict | None = None):
        if self.dialect == "postgresql":
            sql = _pyformat(sql)
        self.raw.execute(sql, params or {})
        return self

    def executemany(self, sql: str, rows: list[dict]):
        if self.dialect == "postgresql":
            sql = _pyformat(sql)
        self.raw.executemany(sql, rows)
        return self

    def one(self, sql: str, params: dict | None = None):
        return self.execute(sql, params).raw.fetchone()

    def all(self, sql: str, params: dict | None = None) -> list:
        return self.execute(sql, params).raw.fetchall()

    def scalar(self, sql: str, params: dict | None = None):
        row = self.one(sql, params)
        return None if row is None else row[0]

    @property
    def rowcount(self) -> int:
        return self.raw.rowcount

    def now(self) -> float:
        """The database's clock on PostgreSQL (one clock for every worker), else this machine's."""
        if self.dialect == "postgresql" and self.clock is not None:
            return self.clock.now(self)
        if self.dialect == "postgresql":
            return float(self.scalar(queries.CLOCK_NOW))
        return time.time()


class DatabaseClock:
    """The database server's clock, without a round trip per transaction.

    The offset between the server's clock and this machine's is measured
    (midpoint of the query) and re-measured every ``refresh`` seconds, so a
    worker whose own clock is minutes off still reads the server's time.
    """

    def __init__(self, refresh: float = 10.0):
        self.refresh = refresh
        self.offset = 0.0
        self.measured_at = -1e18

    def now(self, cur: Cursor) -> float:
        if time.monotonic() - self.measured_at > self.refresh:
            t0 = time.time()
            server = float(cur.scalar(queries.CLOCK_NOW))
            t1 = time.time()
            self.offset = server - (t0 + t1) / 2
            self.measured_at = time.monotonic()
        return time.time() + self.offset
