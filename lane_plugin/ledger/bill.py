"""A pipeline run's token bill: what each stage of one run was estimated, billed and waited.

Read by :meth:`Ledger.run_bill` (the Prefect gate publishes it as the flow run's
``lane-bill`` artifact). One row per (stage, lane) the run used.
"""

from __future__ import annotations

from dataclasses import dataclass

from .db import Cursor


@dataclass(frozen=True)
class BillLine:
    """One (stage, lane) of a run's bill.

    ``jobs`` counts the run's jobs of that stage and lane; ``settled`` those billed
    (done or failed); ``estimated`` and ``actual`` add up the settled jobs'
    estimates and what they really cost, all attempts together; ``overage`` is
    what settlements billed beyond their estimates; ``by_estimate`` counts
    attempts billed their estimate because no usage was found. Waits are from
    intake to first admission, in seconds, of the jobs that were admitted.
    """

    stage: str
    lane: str
    jobs: int
    settled: int
    estimated: int
    actual: int
    overage: int
    by_estimate: int
    late: int
    wait_p50: float | None
    wait_max: float | None

    @property
    def drift(self) -> float | None:
        """``actual / estimated`` of the settled jobs (None when nothing settled)."""
        return round(self.actual / self.estimated, 2) if self.estimated else None

    @property
    def unsettled(self) -> int:
        """Jobs of the run never billed (still waiting, leased, or parked)."""
        return self.jobs - self.settled


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def run_bill(cur: Cursor, run_key: str) -> list[BillLine]:
    """The bill of one run (``job.run_key``), one line per (stage, lane), ordered by stage then lane."""
    lanes = [r[0] for r in cur.all("select name from lane order by name")]
    if not lanes:
        return []
    params = {f"l{i}": name for i, name in enumerate(lanes)}
    params["r"] = run_key
    marks = ", ".join(":" + k for k in params if k != "r")
    # ix_job_run is (lane, run_key): naming the lanes lets both databases use it.
    rows = cur.all(
        "select j.id, j.stage, j.lane, j.est, j.actual, j.state, j.created_at, j.admitted_at, "
        "s.overage, s.by_estimate, s.late from job j left join settlement s on s.job_id = j.id "
        f"where j.lane in ({marks}) and j.run_key = :r",
        params,
    )
    jobs: dict[str, dict] = {}
    for jid, stage, lane, est, actual, state, created, admitted, overage, by_est, late in rows:
        j = jobs.setdefault(jid, {"stage": stage, "lane": lane, "est": est, "actual": actual, "state": state,
                                  "wait": None if admitted is None else max(0.0, admitted - created),
                                  "overage": 0, "by_estimate": 0, "late": 0, "settlements": 0})  # fmt: skip
        if overage is not None:
            j["settlements"] += 1
            j["overage"] += overage
            j["by_estimate"] += int(bool(by_est))
            j["late"] += int(bool(late))
    groups: dict[tuple[str, str], list[dict]] = {}
    for j in jobs.values():
        groups.setdefault((j["stage"], j["lane"]), []).append(j)
    out = []
    for (stage, lane), js in sorted(groups.items()):
        billed = [j for j in js if j["settlements"]]
        waits = [j["wait"] for j in js if j["wait"] is not None]
        out.append(BillLine(
            stage=stage, lane=lane, jobs=len(js), settled=len(billed),
            estimated=sum(j["est"] for j in billed), actual=sum(j["actual"] for j in billed),
            overage=sum(j["overage"] for j in billed), by_estimate=sum(j["by_estimate"] for j in billed),
            late=sum(j["late"] for j in billed), wait_p50=_median(waits), wait_max=max(waits) if waits else None,
        ))  # fmt: skip
    return out
