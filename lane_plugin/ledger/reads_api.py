"""The ledger's read-only calls: one job, where it waits, the parked tail, spend, history, your own query
(:class:`LedgerReads`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..checks import number, text
from . import reads, status
from .bill import BillLine, run_bill
from .db import Database


class LedgerReads:
    """A mixin of :class:`~lane_plugin.Ledger`: what the ledger holds, read in read-only transactions."""

    _run: Callable[..., Any]
    db: Database

    def job(self, job_id: str) -> dict[str, Any]:
        """One job as a dict (every column of the ``job`` table)."""
        job_id = text("job id", job_id)
        return self._run(lambda cur, now: reads.job(cur, job_id), write=False)

    def wait_status(self, job_id: str) -> dict[str, Any]:
        """Where a job stands while it waits: its place in the queue and the lane's room.

        ``position`` follows the admission order (priority: small first, age raising it): 1 means
        admission considers it first; 0 means the job is not waiting. ``blocked_by`` is the first
        rule the job fails right now (``ceiling``, ``drift``, ``headroom``, ``reserve``, ``start_limit``,
        ``burst``, ``lease_cap``, ``stopped``) or None if only jobs ahead of it are in the way; ``reason``
        says why, when it cannot fit before the next reset (it is parked, or waits for the period; the
        drift allowance does not reset, so a job it keeps out of the empty lane is told so).

        Example:
            >>> led.wait_status(job)["position"]                     # doctest: +SKIP
            3
        """
        job_id = text("job id", job_id)
        return self._run(lambda cur, now: status.wait_status(cur, now, job_id), write=False)

    def tail(self, lane: str | None = None) -> list[dict[str, Any]]:
        """Parked jobs, oldest first, with their ``age`` in seconds."""
        lane = text("lane", lane, required=False)
        return self._run(lambda cur, now: reads.tail(cur, now, lane), write=False)

    def settled_jobs(self, *, lane: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        """Done jobs (finished within ``since`` seconds, if given) with what they cost.

        Keys: ``id, lane, stage, est, est_version, actual, overage, finished_at``;
        the drift report's input.
        """
        since, lane = None if since is None else number("since", since, low=0.0, high=1e12), text("lane", lane, required=False)
        return self._run(lambda cur, now: reads.settled_jobs(cur, now, lane=lane, since=since), write=False)

    def spend(self, *, lane: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        """Settlements in time order (``lane, settled_at, actual``), finished within ``since`` seconds."""
        since, lane = None if since is None else number("since", since, low=0.0, high=1e12), text("lane", lane, required=False)
        return self._run(lambda cur, now: reads.spend(cur, now, lane=lane, since=since), write=False)

    def shadow_estimates(self, *, lane: str | None = None) -> list[dict[str, Any]]:
        """Shadow estimates of done jobs: ``job_id, version, est`` (the article's ``est_v2``)."""
        lane = text("lane", lane, required=False)
        return self._run(lambda cur, now: reads.shadow_estimates(cur, lane=lane), write=False)

    def estimator_samples(self, version: str, *, lane: str | None = None) -> list[dict[str, Any]]:
        """Done jobs estimated by ``version`` (admission or shadow): ``stage, est, actual, finished_at``."""
        version, lane = text("version", version), text("lane", lane, required=False)
        return self._run(lambda cur, now: reads.estimator_samples(cur, version, lane=lane), write=False)

    def run_bill(self, run_key: str) -> list[BillLine]:
        """What one run (a Prefect flow run id) was estimated, billed and waited, per stage and lane.

        Example:
            >>> [(b.stage, b.jobs, b.drift) for b in led.run_bill(flow_run_id)]   # doctest: +SKIP
            [('critique', 24, 2.1), ('draft', 24, 1.0)]
        """
        run_key = text("run_key", run_key)
        return self._run(lambda cur, now: run_bill(cur, run_key), write=False)

    def history(self, days: float) -> list[dict[str, Any]]:
        """Done jobs submitted in the last ``days`` days, oldest first (``lane simulate --from-ledger``).

        Keys: ``created_at, stage, est, actual, run_key, rate_cost``.
        """
        days = number("days", days, low=0.0, high=36_500.0, low_open=True)
        return self._run(lambda cur, now: reads.history(cur, now - days * 86_400.0), write=False)

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a query of your own (``:name`` parameters) in a read-only transaction; returns ``(columns, rows)``.

        A statement that would write is refused (:class:`~lane_plugin.errors.InvalidInput`) and changes nothing;
        settings it makes (``set_config``, a pragma) or locks it takes end with it, never reaching the ledger's
        own later statements."""
        sql = text("sql", sql, limit=100_000)
        try:
            return self._run(lambda cur, now: reads.query(cur, sql, params), write=False)
        finally:
            if self.db.dialect == "sqlite":  # a pragma or an attached database must not outlive the query
                self.db.discard()
