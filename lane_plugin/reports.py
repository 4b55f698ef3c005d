"""Drift: what jobs really spent against what the estimator promised (pandas).

The article's definition, per stage: ``drift = sum(actual) / sum(est)`` over
jobs in state ``done``. Near 1.0 the gate is honest; above 1.5 the lane
overspends on every promise; well below 1.0 it wastes admission room.
"""

from __future__ import annotations

import re
import time

from .errors import InvalidInput

HIGH = 1.5
LOW = 0.67
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
GROUPS = ("stage", "est_version", "lane")

# The article's query, verbatim: it must agree with drift() on the same ledger.
ARTICLE_SQL = """select stage,
       count(*)                as jobs,
       sum(est)                as est_tokens,
       sum(actual)             as actual_tokens,
       round(1.0*sum(actual)/nullif(sum(est),0), 2) as drift
from job where state='done'
group by stage"""


def parse_since(text: str | None) -> float | None:
    """``'24h'`` -> seconds; None stays None."""
    if text is None:
        return None
    m = _SPAN.match(str(text))
    if not m:
        raise InvalidInput("since", text, "expected a span like 90s, 30m, 24h, 7d or 2w")
    return float(m.group(1)) * _UNIT[m.group(2)]


def verdict(drift: float | None) -> str:
    if drift is None or drift != drift:
        return "no data"
    if drift > HIGH:
        return "overspends: fix the estimator before you touch the ceiling"
    if drift < LOW:
        return "wastes admission room: estimates are too high"
    return "honest"


def done_jobs(ledger, *, lane: str | None = None, since: str | float | None = None):
    """Settled jobs as a DataFrame: id, lane, stage, est, est_version, actual, overage, finished_at."""
    import pandas as pd

    span = parse_since(since) if isinstance(since, str) else since
    where, params = ["j.state = 'done'"], {}
    if lane:
        where.append("j.lane = :lane")
        params["lane"] = lane
    if span is not None:
        where.append("j.finished_at >= :cut")
        params["cut"] = time.time() - span
    cols, rows = ledger.rows(
        "select j.id, j.lane, j.stage, j.est, coalesce(j.est_version, '-') as est_version, j.actual, "
        "coalesce(s.overage, 0) as overage, j.finished_at from job j left join "
        "(select job_id, sum(overage) as overage from settlement group by job_id) s on s.job_id = j.id "
        f"where {' and '.join(where)}",
        params,
    )
    return pd.DataFrame(rows, columns=cols)


def drift(ledger, *, lane: str | None = None, since: str | float | None = None, by=("stage",)):
    """Drift per group (default per stage), with p50/p90 of the per-job ratio and a verdict.

    Example:
        >>> drift(Ledger("sqlite:///lane.db")).to_dict("records")   # doctest: +SKIP
        [{'stage': 'draft', 'jobs': 200, 'est_tokens': ..., 'drift': 1.02, ...}]
    """
    import pandas as pd

    by = list(by)
    for g in by:
        if g not in GROUPS:
            raise InvalidInput("group by", g, f"expected one of {', '.join(GROUPS)}")
    df = done_jobs(ledger, lane=lane, since=since)
    columns = by + ["jobs", "est_tokens", "actual_tokens", "drift", "p50", "p90", "overage_tokens", "verdict"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    df["ratio"] = df["actual"] / df["est"]
    g = df.groupby(by, sort=True)
    out = g.agg(
        jobs=("id", "count"),
        est_tokens=("est", "sum"),
        actual_tokens=("actual", "sum"),
        p50=("ratio", lambda s: s.quantile(0.5)),
        p90=("ratio", lambda s: s.quantile(0.9)),
        overage_tokens=("overage", "sum"),
    ).reset_index()
    out["drift"] = (out["actual_tokens"] / out["est_tokens"]).round(2)
    out["p50"] = out["p50"].round(2)
    out["p90"] = out["p90"].round(2)
    out["verdict"] = out["drift"].map(verdict)
    return out[columns]


def render(df, fmt: str = "table") -> str:
    """The report as text: ``table`` (aligned), ``csv``, ``json`` or ``markdown``."""
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "json":
        return df.to_json(orient="records", indent=2)
    if fmt == "markdown":
        head = "| " + " | ".join(df.columns) + " |"
        sep = "|" + "|".join("---" for _ in df.columns) + "|"
        body = ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
        return "\n".join([head, sep, *body])
    if fmt == "table":
        return df.to_string(index=False) if not df.empty else "no settled jobs yet"
    raise InvalidInput("format", fmt, "expected table, csv, json or markdown")
