"""Drift: what jobs really spent against what the estimator promised (pandas).

The article's definition, per stage: ``drift = sum(actual) / sum(est)`` over
jobs in state ``done``. Near 1.0 the gate is honest; above 1.5 the lane
overspends on every promise; well below 1.0 it wastes admission room.

A sum can lie, so each group also carries what it hides (issue 12):
``under`` the share of jobs that spent more than their estimate,
``overspend`` the tokens spent beyond estimates as a share of all actual
tokens, ``p99`` the 99th percentile of the per-job ratio, and ``by_estimate``
the jobs billed their estimate because no usage was found (their "actual" is
the estimate: drift 1.0 by construction). A group with any job billed by
estimate, or whose drift sits near 1.0 over large errors both ways
(``overspend`` at least :data:`TWO_SIDED`), is never called *honest*.
"""

from __future__ import annotations

import decimal
import re

from ..errors import InvalidInput
from ..tables import WIDTH, fit

HIGH = 1.5
LOW = 0.67
# Tokens spent beyond estimates, as a share of actual, past which a drift near 1.0 is two errors that cancel.
TWO_SIDED = 0.10
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
GROUPS = ("stage", "est_version", "lane", "version")
SETTLED_COLUMNS = (
    "id",
    "lane",
    "stage",
    "est",
    "est_version",
    "actual",
    "overage",
    "finished_at",
    "by_estimate",
    "rate_cost",
)

# Every column of the drift report, in the order shown (lane report --help and docs/cli.md say the same).
COLUMNS_EXPLAINED = {
    "stage": "the group (--by): the pipeline stage; lane, est_version or version when grouped by them",
    "role": "with --by version: admission (the estimate jobs were admitted with) or shadow (a candidate's, "
    "on the same jobs)",
    "jobs": "done jobs in the group",
    "est_tokens": "the sum of their estimates",
    "actual_tokens": "the sum of what they really spent (every attempt)",
    "drift": "actual_tokens / est_tokens: above 1.0 the estimates promise less than the stage spends",
    "p50": "the median of the per-job ratio actual / est",
    "p90": "the 90th percentile of the per-job ratio",
    "overage_tokens": "tokens billed beyond the estimates (and late settlements): never hidden",
    "verdict": f"honest ({LOW} to {HIGH}), overspends (above {HIGH}), wastes room (below {LOW}), billed by "
    f"estimate (some jobs reported no usage), two-sided (near 1.0 with {TWO_SIDED:.0%} or more of the tokens "
    "beyond estimates: errors both ways cancel in the sum)",
    "under": "the share of jobs that spent more than their estimate (a percent)",
    "overspend": "the tokens spent beyond estimates, as a share of all actual tokens (a percent)",
    "p99": "the 99th percentile of the per-job ratio",
    "by_estimate": "jobs billed their estimate because no usage was found (drift 1.0 by construction)",
    "rate_cost_set": "yes when jobs carried a rate_cost of their own (what the provider's rate limiter counts) "
    "unlike their estimate",
}
# Columns a 100-character table leaves out first (the last first); lane report --wide shows them.
OPTIONAL_COLUMNS = ("est_tokens", "actual_tokens", "p50", "p90", "overage_tokens", "under", "overspend", "p99")
OPTIONAL_COLUMNS += ("by_estimate", "rate_cost_set")
PERCENT_COLUMNS = {"under": 0, "overspend": 1}  # shown as percents in a table (digits after the point)


def ratio2(actual, est) -> float | None:
    """``actual / est`` rounded to 2 places as the article's SQL does (half away from zero).

    Computed in decimal to 15 significant digits, like SQLite's ``round`` (and
    PostgreSQL's on ``numeric``), so 1.725 becomes 1.73 where binary floats and
    pandas would give 1.72.

    Example:
        >>> ratio2(6900, 4000), ratio2(1015, 1000), ratio2(5, 0)
        (1.73, 1.02, None)
    """
    if not est:
        return None
    with decimal.localcontext() as ctx:
        ctx.prec = 15
        q = decimal.Decimal(int(actual)) / decimal.Decimal(int(est))
    return float(q.quantize(decimal.Decimal("0.01"), rounding=decimal.ROUND_HALF_UP))


def round2(x: float) -> float:
    """A float rounded to 2 places half away from zero, through its 15-digit decimal form."""
    if x != x:
        return x
    return float(decimal.Decimal(format(x, ".15g")).quantize(decimal.Decimal("0.01"), rounding=decimal.ROUND_HALF_UP))


def parse_since(text: str | None) -> float | None:
    """``'24h'`` -> seconds; None stays None."""
    if text is None:
        return None
    m = _SPAN.match(str(text))
    if not m:
        raise InvalidInput("since", text, "expected a span like 90s, 30m, 24h, 7d or 2w")
    return float(m.group(1)) * _UNIT[m.group(2)]


def verdict(drift: float | None, *, by_estimate: int = 0, overspend: float | None = None) -> str:
    """A verdict short enough for a table cell (the summary explains them below the table).

    ``by_estimate``: jobs of the group billed their estimate (usage missing);
    ``overspend``: tokens spent beyond estimates as a share of actual.

    Example:
        >>> verdict(1.73), verdict(1.1), verdict(0.52), verdict(None)
        ('overspends', 'honest', 'wastes room', 'no data')
        >>> verdict(1.0, by_estimate=3), verdict(1.0, overspend=0.31)
        ('billed by estimate', 'two-sided')
    """
    if drift is None or drift != drift:
        return "no data"
    if drift > HIGH:
        return "overspends"
    if by_estimate:
        return "billed by estimate"
    if drift < LOW:
        return "wastes room"
    if overspend is not None and overspend >= TWO_SIDED:
        return "two-sided"
    return "honest"


def done_jobs(ledger, *, lane: str | None = None, since: str | float | None = None):
    """Settled jobs as a DataFrame: id, lane, stage, est, est_version, actual, overage, finished_at."""
    import pandas as pd

    span = parse_since(since) if isinstance(since, str) else since
    return pd.DataFrame(ledger.settled_jobs(lane=lane, since=span), columns=list(SETTLED_COLUMNS))


def version_jobs(ledger, *, lane: str | None = None, since: str | float | None = None):
    """Settled jobs once per estimate they carry: the admission one and every shadow.

    Columns: those of :func:`done_jobs` plus ``version`` and ``role``
    (``admission`` or ``shadow``). A shadow row's ``est`` is the shadow's number
    and its ``overage`` what the lane would have overrun had it admitted with
    it, ``max(0, actual - est)``, so versions compare on the same jobs.
    """
    import pandas as pd

    df = done_jobs(ledger, lane=lane, since=since)
    primary = df.assign(version=df["est_version"], role="admission")
    if df.empty:
        return primary
    shadows = pd.DataFrame(ledger.shadow_estimates(lane=lane), columns=["job_id", "version", "est"])
    shadows = shadows.rename(columns={"job_id": "id", "est": "shadow_est"})
    shadows = shadows.merge(df, on="id", how="inner")  # the window and lane filters of df apply
    shadows = shadows.assign(
        est=shadows["shadow_est"], role="shadow", overage=(shadows["actual"] - shadows["shadow_est"]).clip(lower=0)
    )
    return pd.concat([primary, shadows[primary.columns]], ignore_index=True)


def _check_by(by) -> list[str]:
    if isinstance(by, str):
        by = [g.strip() for g in by.split(",") if g.strip()]
    by = list(by)
    if not by:
        raise InvalidInput("group by", by, f"expected at least one of {', '.join(GROUPS)}")
    for g in by:
        if g not in GROUPS:
            raise InvalidInput("group by", g, f"expected one of {', '.join(GROUPS)}")
    if "version" in by and "est_version" in by:
        raise InvalidInput("group by", ",".join(by), "use version (admission and shadow) or est_version, not both")
    return by


def drift(ledger, *, lane: str | None = None, since: str | float | None = None, by=("stage",)):
    """Drift per group (default per stage), with p50/p90 of the per-job ratio and a verdict.

    Args:
        ledger: a :class:`~lane_plugin.Ledger`.
        lane: only this lane.
        since: only jobs finished within this span (``"24h"``) or seconds.
        by: group columns from ``stage``, ``lane``, ``est_version`` (the
            admission estimate only) and ``version`` (admission *and* shadow
            estimates: a shadow's drift is ``sum(actual) / sum(shadow est)`` over
            the same done jobs, and a ``role`` column says which it is).

    Example:
        >>> drift(Ledger("sqlite:///lane.db")).to_dict("records")   # doctest: +SKIP
        [{'stage': 'draft', 'jobs': 200, 'est_tokens': ..., 'drift': 1.02, ...}]
        >>> drift(led, by="stage,version")[["stage", "version", "role", "drift"]]   # doctest: +SKIP
          stage                        version       role  drift
          draft                       const-v1  admission   1.81
          draft  calibrated(const-v1)#5daa705d     shadow   0.98
    """
    import pandas as pd

    by = _check_by(by)
    versions = "version" in by
    df = version_jobs(ledger, lane=lane, since=since) if versions else done_jobs(ledger, lane=lane, since=since)
    keys = by + (["role"] if versions else [])
    columns = keys + [
        "jobs",
        "est_tokens",
        "actual_tokens",
        "drift",
        "p50",
        "p90",
        "overage_tokens",
        "verdict",
        "under",
        "overspend",
        "p99",
        "by_estimate",
        "rate_cost_set",
    ]
    if df.empty:
        return pd.DataFrame(columns=columns)
    df["ratio"] = df["actual"] / df["est"]
    df["beyond"] = (df["actual"] - df["est"]).clip(lower=0)
    df["is_under"] = df["actual"] > df["est"]
    df["by_estimate"] = df["by_estimate"].fillna(False).astype(bool)
    # a rate_cost of its own (what the provider's limiter counts at request time), not the estimate's copy
    df["rate_cost_set"] = df["rate_cost"].notna() & (df["rate_cost"] != df["est"])
    g = df.groupby(keys, sort=True)
    out = g.agg(
        jobs=("id", "count"),
        est_tokens=("est", "sum"),
        actual_tokens=("actual", "sum"),
        p50=("ratio", lambda s: s.quantile(0.5)),
        p90=("ratio", lambda s: s.quantile(0.9)),
        p99=("ratio", lambda s: s.quantile(0.99)),
        overage_tokens=("overage", "sum"),
        under=("is_under", "mean"),
        beyond=("beyond", "sum"),
        by_estimate=("by_estimate", "sum"),
        rate_cost_set=("rate_cost_set", "any"),
    ).reset_index()
    for col in ("jobs", "est_tokens", "actual_tokens", "overage_tokens", "by_estimate"):
        out[col] = out[col].astype("int64")
    out["drift"] = [ratio2(a, e) for a, e in zip(out["actual_tokens"], out["est_tokens"])]
    out["overspend"] = [round(b / a, 4) if a else 0.0 for b, a in zip(out["beyond"], out["actual_tokens"])]
    out["under"] = out["under"].map(lambda x: round(float(x), 4))
    out["rate_cost_set"] = out["rate_cost_set"].astype(bool)
    for col in ("p50", "p90", "p99"):
        out[col] = out[col].map(round2)
    out["verdict"] = [
        verdict(d, by_estimate=n, overspend=o) for d, n, o in zip(out["drift"], out["by_estimate"], out["overspend"])
    ]
    if versions:  # admission row first, then shadows, within each group
        out = out.sort_values(by=[k for k in by if k != "version"] + ["role", "version"], kind="stable")
    return out[columns].reset_index(drop=True)


def drift_over_time(
    ledger, *, lane: str | None = None, since: str | float | None = None, buckets: int = 24, by: str = "stage"
):
    """Drift per ``by`` (stage) per time bucket of ``finished_at``, for plotting.

    Returns columns ``[by, "bucket", "jobs", "drift"]`` where ``bucket`` is the
    bucket's start (epoch seconds); the span is split into ``buckets`` equal parts.
    """
    import pandas as pd

    if isinstance(buckets, bool) or not isinstance(buckets, int) or not 1 <= buckets <= 1000:
        raise InvalidInput("buckets", buckets, "expected a whole number from 1 to 1000")
    by = _check_by([by])[0]
    df = version_jobs(ledger, lane=lane, since=since) if by == "version" else done_jobs(ledger, lane=lane, since=since)
    cols = [by, "bucket", "jobs", "drift"]
    df = df.dropna(subset=["finished_at"])
    if df.empty:
        return pd.DataFrame(columns=cols)
    lo, hi = float(df["finished_at"].min()), float(df["finished_at"].max())
    width = max((hi - lo) / buckets, 1e-9)
    idx = ((df["finished_at"] - lo) / width).astype(int).clip(upper=buckets - 1)
    df = df.assign(bucket=lo + idx * width)
    out = (
        df.groupby([by, "bucket"], sort=True)
        .agg(jobs=("id", "count"), est=("est", "sum"), actual=("actual", "sum"))
        .reset_index()
    )
    out["drift"] = out["actual"] / out["est"]
    return out[cols]


def spend_over_time(ledger, *, lane: str | None = None, since: str | float | None = None, points: int = 400):
    """Each lane's spend in its current period over time, as % of its ceiling, for the budget panel.

    ``spent`` at time t is the lane's ``spent`` now less what settled after t
    (settlements are the only thing that moves it), within the current period.
    Returns columns ``lane, t, pct_of_ceiling, start_pct`` (at most ``points`` rows per lane).
    """
    import pandas as pd

    cols = ["lane", "t", "pct_of_ceiling", "start_pct"]
    window = parse_since(since) if isinstance(since, str) or since is None else float(since)
    rows = []
    for s in ledger.lanes():
        if lane and s["lane"] != lane:
            continue
        found = [r for r in ledger.spend(lane=s["lane"], since=window)]
        if not found:
            continue
        later = sum(r["actual"] for r in found)
        spent = s["spent"]
        pts = [(found[0]["settled_at"], spent - later)]
        for r in found:
            later -= r["actual"]
            pts.append((r["settled_at"], spent - later))
        step = max(1, len(pts) // points)
        pts = pts[::step] + ([pts[-1]] if (len(pts) - 1) % step else [])
        start_pct = 100.0 * s["start_limit"] / s["ceiling"]
        rows += [(s["lane"], t, max(0.0, 100.0 * v / s["ceiling"]), round(start_pct, 1)) for t, v in pts]
    return pd.DataFrame(rows, columns=cols)


def render(df, fmt: str = "table", *, wide: bool = False, width: int = WIDTH) -> str:
    """The report as text: ``table`` (aligned, fits ``width``; ``wide``: every column), ``csv``, ``json`` or
    ``markdown``."""
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
        return "\n".join(table_lines(df, wide=wide, width=width)) if not df.empty else "no settled jobs yet"
    raise InvalidInput("format", fmt, "expected table, csv, json or markdown")


def table_lines(df, *, wide: bool = False, width: int = WIDTH) -> list[str]:
    """The report as a table that fits ``width`` (``wide``: every column): shares as percents, flags as yes/no."""
    columns = list(df.columns)
    rows = []
    for rec in df.to_dict("records"):
        row = []
        for c in columns:
            v = rec[c]
            if c in PERCENT_COLUMNS and v == v:
                v = f"{100 * v:.{PERCENT_COLUMNS[c]}f}%"
            elif isinstance(v, bool):
                v = "yes" if v else "no"
            elif isinstance(v, float):
                v = "-" if v != v else f"{v:.2f}"
            elif isinstance(v, int):
                v = f"{v:,}"
            row.append(v)
        rows.append(row)
    right = {c for c in columns if c not in ("verdict", "rate_cost_set", *GROUPS, "role")}
    return fit(columns, rows, width=width, wide=wide, right=right, optional=OPTIONAL_COLUMNS)
