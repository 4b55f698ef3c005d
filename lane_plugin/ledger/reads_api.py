"""The ledger's read-only calls: one job, where it waits, the parked tail, spend, history, your own query
(:class:`LedgerReads`)."""

from __future__ import annotations

from typing import Any

from ..checks import number, text
from . import reads, status
from .bill import BillLine, run_bill


class LedgerReads:
    """The read-only calls of one :class:`~lane_plugin.Ledger` (its part, composed: the ledger's methods of the same
    names call these): what the ledger holds, read in read-only transactions."""

    def __init__(self, ledger: Any) -> None:  # the Ledger (api.py imports this module)
        self.led = ledger

    def job(self, job_id: str) -> dict[str, Any]:
        job_id = text("job id", job_id)
        return self.led._run(lambda cur, now: reads.job(cur, job_id), write=False)

    def wait_status(self, job_id: str) -> dict[str, Any]:
        job_id = text("job id", job_id)
        return self.led._run(lambda cur, now: status.wait_status(cur, now, job_id), write=False)

    def tail(self, lane: str | None = None) -> list[dict[str, Any]]:
        lane = text("lane", lane, required=False)
        return self.led._run(lambda cur, now: reads.tail(cur, now, lane), write=False)

    def settled_jobs(self, *, lane: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        since, lane = (
            None if since is None else number("since", since, low=0.0, high=1e12),
            text("lane", lane, required=False),
        )
        return self.led._run(lambda cur, now: reads.settled_jobs(cur, now, lane=lane, since=since), write=False)

    def spend(self, *, lane: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        since, lane = (
            None if since is None else number("since", since, low=0.0, high=1e12),
            text("lane", lane, required=False),
        )
        return self.led._run(lambda cur, now: reads.spend(cur, now, lane=lane, since=since), write=False)

    def shadow_estimates(self, *, lane: str | None = None) -> list[dict[str, Any]]:
        lane = text("lane", lane, required=False)
        return self.led._run(lambda cur, now: reads.shadow_estimates(cur, lane=lane), write=False)

    def estimator_samples(self, version: str, *, lane: str | None = None) -> list[dict[str, Any]]:
        version, lane = text("version", version), text("lane", lane, required=False)
        return self.led._run(lambda cur, now: reads.estimator_samples(cur, version, lane=lane), write=False)

    def run_bill(self, run_key: str) -> list[BillLine]:
        run_key = text("run_key", run_key)
        return self.led._run(lambda cur, now: run_bill(cur, run_key), write=False)

    def history(self, days: float) -> list[dict[str, Any]]:
        days = number("days", days, low=0.0, high=36_500.0, low_open=True)
        return self.led._run(lambda cur, now: reads.history(cur, now - days * 86_400.0), write=False)

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        sql = text("sql", sql, limit=100_000)
        try:
            return self.led._run(lambda cur, now: reads.query(cur, sql, params), write=False)
        finally:
            if self.led.db.dialect == "sqlite":  # a pragma or an attached database must not outlive the query
                self.led.db.discard()
