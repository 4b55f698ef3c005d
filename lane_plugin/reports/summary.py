"""The drift report told in words: the row it leads with, what to do about it, and the markdown summary the
scheduled flow publishes (the numbers come from :mod:`lane_plugin.reports.drift`)."""

from __future__ import annotations

from .drift import HIGH, LOW, TWO_SIDED, render, verdict


def worst(report) -> dict | None:
    """The row a drift summary leads with: the worst overspender, if any row spends more than it promised.

    An overspender takes budget the lane did not plan for (runs may not finish);
    an underspender only leaves room idle, so it leads only when nothing
    overspends (then the one furthest below 1.0). Only admission rows count (a
    shadow's drift is a candidate, not the lane's truth).
    """
    if report is None or report.empty:
        return None
    rows = report[report["role"] == "admission"] if "role" in report.columns else report
    rows = rows[rows["drift"].notna()]
    if rows.empty:
        return None
    over = rows[rows["drift"] > 1.0]
    if not over.empty:
        return over.loc[over["drift"].idxmax()].to_dict()
    return rows.loc[rows["drift"].idxmin()].to_dict()


def advice(row: dict, report=None) -> str:
    """What to do about one report row, in the article's words."""
    d = row.get("drift")
    stage = row.get("stage", "this group")
    if d is None or d != d:
        return "no settled jobs: nothing to judge yet."
    better = ""
    if report is not None and "version" in report.columns and "stage" in report.columns:
        cands = report[(report["stage"] == stage) & (report["role"] == "shadow")]
        if not cands.empty:
            best = cands.loc[(cands["drift"] - 1.0).abs().idxmin()]
            better = (
                f" Shadow estimator `{best['version']}` has drift {best['drift']:.2f} on the same "
                f"{int(best['jobs'])} jobs: switch admission to it."
            )
    v = row.get("verdict") or verdict(d, by_estimate=int(row.get("by_estimate") or 0), overspend=row.get("overspend"))
    if d > HIGH:
        return (
            f"`{stage}` spends {d:.2f}x what it promises, so every admission overspends the lane. "
            "Fix the estimator before you touch the ceiling (e.g. admit with `learned()`: the prompt's "
            "tokens plus the stage's learned output)." + better
        )
    if v == "billed by estimate":
        return (
            f"{int(row['by_estimate'])} of {int(row['jobs'])} `{stage}` jobs were billed their estimate because "
            "no usage was found: for them drift is 1.0 by construction and says nothing. Return the LLM "
            "response from the task (or call `report_usage(resp)`) so the gate reads what was really spent."
        )
    if d < LOW:
        if row.get("rate_cost_set"):
            keep = (
                "Lower the estimate (`est`) and leave `rate_cost` as it is: it is what the provider's rate "
                "limiter counts at request time (prompt + max_tokens), not a guess at the bill."
            )
        else:
            keep = (
                "Lower the estimate (or learn it) rather than raising the ceiling; if it carries the request's "
                "max_tokens for the provider's rate limit, pass that as `rate_cost=` first, so the limiter "
                "keeps counting it."
            )
        return f"`{stage}` spends only {d:.2f}x its estimate: admission room is wasted. " + keep + better
    if v == "two-sided":
        return (
            f"`{stage}` has drift {d:.2f}, but {row['under']:.0%} of its jobs spent more than their estimate "
            f"and {row['overspend']:.0%} of its tokens went beyond estimates (p99 ratio {row['p99']:.2f}): the "
            "sum hides errors both ways. Estimate at the mean with a learned spread (`learned()`), so "
            "admission keeps headroom for what is in flight, rather than padding every job." + better
        )
    return f"`{stage}` is honest (drift {d:.2f}): leave the estimator alone."


def summary_markdown(
    report, *, title: str = "Lane drift", since: str | None = None, plot: str | None = None, ledger: str | None = None
) -> str:
    """A short markdown summary: the worst overspender and what to do, the table, then how to read it.

    ``plot`` is accepted for compatibility and not shown: a path on the worker
    means nothing to the reader (the flow publishes the image itself).
    ``ledger`` (a redacted URL) is named when there is nothing to report.
    """
    lines = [f"# {title}" + (f" (last {since})" if since else ""), ""]
    row = worst(report)
    if row is None:
        where = f" in the ledger at {ledger}" if ledger else ""
        lines.append(f"No settled jobs{where} in the window: nothing to report yet.")
        return "\n".join(lines)
    admitted = report[report["role"] == "admission"] if "role" in report.columns else report
    high = admitted[admitted["drift"] > HIGH]
    label = " / ".join(str(row[k]) for k in ("stage", "lane", "est_version", "version") if k in row)
    lead = "Worst overspender" if row["drift"] > 1.0 else "No stage overspends; furthest below its estimate"
    lines += [
        f"**{lead}: {label}**, drift {row['drift']:.2f} over {int(row['jobs'])} jobs "
        f"(p50 {row['p50']:.2f}, p90 {row['p90']:.2f}, p99 {row['p99']:.2f}, {row['under']:.0%} under-estimated, "
        f"{row['overspend']:.0%} of tokens beyond estimates, {int(row['by_estimate'])} billed by estimate, "
        f"overage {int(row['overage_tokens']):,} tokens).",
        "",
        advice(row, report),
        "",
        f"{len(high)} group(s) above {HIGH}." if len(high) else f"No group above {HIGH}.",
        "",
        render(report, "markdown"),
        "",
        "**How to read this.** Drift = sum(actual) / sum(est) over done jobs; p50 and p90 are the spread of "
        "the per-job ratio. Verdicts: *honest* (from "
        f"{LOW} to {HIGH}); *overspends* (above {HIGH}): every admission promises less than the stage "
        "spends, so the lane runs out before its runs finish: fix the estimator before you touch the "
        f"ceiling; *wastes room* (below {LOW}): estimates are too high and admission room sits idle: "
        "lower or calibrate the estimate rather than raising the ceiling. A sum can hide errors: `under` is "
        "the share of jobs that spent more than their estimate, `overspend` the tokens beyond estimates as a "
        "share of actual, `p99` the per-job ratio's 99th percentile, `by_estimate` the jobs billed their "
        "estimate because no usage was found. *billed by estimate*: some jobs reported no usage, so the "
        f"stage's drift is partly 1.0 by construction; *two-sided*: drift near 1.0 with {TWO_SIDED:.0%} or "
        "more of the tokens beyond estimates (errors both ways cancel in the sum). Read drift, not totals.",
    ]
    return "\n".join(lines)
