"""A pipeline run's token bill: what each stage of one run was estimated, billed and waited.

Read by :meth:`Ledger.run_bill` (the Prefect gate publishes it as the flow run's
``lane-bill`` artifact). One row per (stage, lane) the run used.

A job is counted (``jobs``, ``settled``, ``estimated``, waits) in the lane it is in now; what was
billed (``actual``, ``overage``, ``by_estimate``, ``late``) in the lane each settlement billed. The two
differ only for a job moved to its fallback after an attempt of it was leased: a late settlement of that
attempt billed the lane it ran in (its provider billed it), and the bill says so, so that each lane's
line adds up to what the run spent there. Such a lane may have a line of billed tokens and no job.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import queries
from .db import Cursor


@dataclass(frozen=True)
class BillLine:
    """One (stage, lane) of a run's bill.

    ``jobs`` counts the run's jobs of that stage now in that lane; ``settled`` those billed
    (done or failed); ``estimated`` adds up the settled jobs' estimates; ``actual`` what
    the settlements billed in this lane (all attempts of the jobs that ran here);
    ``overage`` what they billed beyond their estimates; ``by_estimate`` counts
    attempts billed their estimate because no usage was found. Waits are from
    intake to first admission, in seconds, of the jobs that were admitted. ``tenant``: who the
    jobs belong to in the lane (:mod:`lane_plugin.policy.fairness`). ``rate_limited`` counts the
    provider rate-limit errors (429s) the jobs' attempts met.
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
    tenant: str = ""  # the tenant(s) of these jobs in their lane, comma-separated (usually one)
    rate_limited: int = 0

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
    lanes = [r[0] for r in cur.all(queries.BILL_LANE_NAMES)]
    if not lanes:
        return []
    params = {f"l{i}": name for i, name in enumerate(lanes)}
    params["r"] = run_key
    # ix_job_run is (lane, run_key): naming the lanes lets both databases use it.
    rows = cur.all(
        queries.bill_jobs_of_run(k for k in params if k != "r"),
        params,
    )
    groups: dict[tuple[str, str], dict] = {}

    def group(stage: str, lane: str) -> dict:
        return groups.setdefault(
            (stage, lane), {"jobs": {}, "actual": 0, "overage": 0, "by_estimate": 0, "late": 0, "tenants": set()}
        )

    for jid, stage, lane, est, created, admitted, tenant, limited, s_lane, actual, overage, by_est, late in rows:
        wait = None if admitted is None else max(0.0, admitted - created)
        here = group(stage, lane)
        here["tenants"].add(tenant)
        job = here["jobs"].setdefault(jid, {"est": est, "billed": False, "wait": wait, "limited": limited or 0})
        if s_lane is not None:
            job["billed"] = True
            g = group(stage, s_lane)
            g["actual"] += actual
            g["overage"] += overage
            g["by_estimate"] += int(bool(by_est))
            g["late"] += int(bool(late))
    out = []
    for (stage, lane), g in sorted(groups.items()):
        js = list(g["jobs"].values())
        waits = [j["wait"] for j in js if j["wait"] is not None]
        out.append(
            BillLine(
                stage=stage,
                lane=lane,
                jobs=len(js),
                settled=sum(j["billed"] for j in js),
                estimated=sum(j["est"] for j in js if j["billed"]),
                actual=g["actual"],
                overage=g["overage"],
                by_estimate=g["by_estimate"],
                late=g["late"],
                wait_p50=_median(waits),
                wait_max=max(waits) if waits else None,
                tenant=", ".join(sorted(g["tenants"])),
                rate_limited=sum(j["limited"] for j in js),
            )
        )
    return out
