"""Showing ``lane simulate`` results: a table that fits 80 columns, markdown, JSON, a plot.

The table is one column per policy and one row per figure, so it stays
readable in an 80-column terminal however many figures there are.
matplotlib is imported only by :func:`plot`.
"""

from __future__ import annotations

import math
import platform
import sys
import textwrap
from dataclasses import asdict

from ..policy.limits import NO_TOKENS_LIMIT, format_limit
from .config import SimConfig, refused_at_intake
from .results import SimResult, big_threshold, percentile
from .traffic import Trace

WIDTH = 80


def fmt_seconds(s: float | None) -> str:
    """12.0s, 3.5m, 4.2h, 1.5d; '-' for NaN."""
    if s is None or math.isnan(s):
        return "-"
    if s < 120:
        return f"{s:.1f}s"
    if s < 7_200:
        return f"{s / 60:.1f}m"
    if s < 172_800:
        return f"{s / 3_600:.1f}h"
    return f"{s / 86_400:.1f}d"


def fmt_tokens(n: int) -> str:
    """900, 4,857, 45.0k, 12.35M."""
    if abs(n) >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if abs(n) >= 10_000:
        return f"{n / 1e3:.1f}k"
    return f"{n:,}"


def _pair(a: float, b: float) -> str:
    return "-" if math.isnan(a) else f"{fmt_seconds(a)}/{fmt_seconds(b)}"


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _bound(r: SimResult) -> str:
    if r.bound_by is None:
        return "-"
    return f"{r.bound_by} {_pct(r.limit_held[r.bound_by], r.end_s)}"


# (label, its --json keys, what it shows, how to format one result). Labels fit 15 columns.
FIGURES = (
    ("jobs", "jobs", "submitted and not refused", lambda r: f"{r.jobs:,}"),
    ("done", "done", "settled", lambda r: f"{r.done:,}"),
    (
        "runs done/begun",
        "runs_finished runs_started",
        "runs with every stage settled / with a stage admitted",
        lambda r: f"{r.runs_finished:,}/{r.runs_started:,}",
    ),
    ("spent", "spent", "tokens settled", lambda r: fmt_tokens(r.spent)),
    (
        "budget used",
        "budget_used",
        "spent / the ceilings of the periods traffic arrived in",
        lambda r: f"{100 * r.budget_used:.1f}%",
    ),
    ("over ceiling", "over_ceiling", "settled past the ceiling, per period", lambda r: fmt_tokens(r.over_ceiling)),
    (
        "over allowance",
        "over_allowance",
        "settled past the allowance, per period",
        lambda r: fmt_tokens(r.over_allowance),
    ),
    (
        "stranded",
        "stranded_tokens",
        "settled for runs that never finished (% of spent)",
        lambda r: f"{fmt_tokens(r.stranded_tokens)} {_pct(r.stranded_tokens, r.spent)}",
    ),
    ("over burst", "over_burst", "rate tokens past the burst in a sliding window", lambda r: fmt_tokens(r.over_burst)),
    (
        "over burst act",
        "over_burst_actual",
        "the same, counting actual tokens",
        lambda r: fmt_tokens(r.over_burst_actual),
    ),
    (
        "over limits",
        "over_limits",
        "units past the lane's other limits (requests, input/output tokens), sliding",
        lambda r: fmt_tokens(sum(r.over_limits.values())),
    ),
    (
        "bound by",
        "bound_by limit_held",
        "the limit that kept the queue waiting longest (% of the clock)",
        lambda r: _bound(r),
    ),
    ("busy %", "busy_pct", "worker slots busy", lambda r: f"{r.busy_pct:.1f}"),
    (
        "wait p50/p99",
        "wait_p50 wait_p99",
        "submission to start, admitted jobs",
        lambda r: _pair(r.wait_p50, r.wait_p99),
    ),
    (
        "top-10% p50/99",
        "big_wait_p50 big_wait_p99",
        "the same, largest decile of estimates",
        lambda r: _pair(r.big_wait_p50, r.big_wait_p99),
    ),
    ("never admitted", "never_admitted", "still waiting at the end", lambda r: f"{r.never_admitted:,}"),
    (
        "  wait p50/p99",
        "never_admitted_wait_p50 never_admitted_wait_p99",
        "their wait until the end (a lower bound)",
        lambda r: _pair(r.never_admitted_wait_p50, r.never_admitted_wait_p99),
    ),
    ("parked", "parked", "deadline passed or attempts exhausted", lambda r: f"{r.parked:,}"),
    (
        "  wait p50/p99",
        "parked_wait_p50 parked_wait_p99",
        "their wait until parked",
        lambda r: _pair(r.parked_wait_p50, r.parked_wait_p99),
    ),
    ("starved", "starved", "never admitted, overtaken, waited >= starve_after", lambda r: f"{r.starved:,}"),
    ("expired leases", "expired", "leases the worker did not start in time", lambda r: f"{r.expired:,}"),
    (
        "not submitted",
        "not_submitted",
        "stages of runs that broke off or never reached",
        lambda r: f"{r.not_submitted:,}",
    ),
    ("jobs/s", "jobs_per_s", "simulated jobs per wall-clock second", lambda r: f"{r.jobs_per_s:,.0f}"),
)


def figures(results: list[SimResult]) -> list[tuple[str, list[str]]]:
    """One (label, value per policy) row per figure."""
    return [(label, [fmt(r) for r in results]) for label, _, _, fmt in FIGURES]


def scenario(trace: Trace, cfg: SimConfig) -> dict:
    """What was simulated: the traffic and every lane/worker setting."""
    refused = refused_at_intake(trace, cfg)
    rate = trace.rate_costs()
    return {
        "source": trace.source,
        "jobs": len(trace),
        "refused_at_intake": sum(refused),
        "span_hours": round(trace.span / 3_600, 2),
        "est_tokens": sum(trace.est),
        "actual_tokens": sum(trace.actual),
        "rate_cost_tokens": sum(rate),
        "output_tokens": sum(o for o in trace.output_tokens if o is not None),
        "runs": len({rk for rk in trace.run_key if rk is not None}),
        "single_calls": sum(1 for rk in trace.run_key if rk is None),
        "chained": cfg.chain,
        "window": "sliding",
        "drift": round(sum(trace.actual) / max(sum(trace.est), 1), 3),
        "top_decile_est_from": big_threshold(trace, refused),
        "config": asdict(cfg),
    }


def _limits_text(cfg: SimConfig) -> str:
    """The lane's limits as the header says them: ``burst 40.0k per 1 s (sliding), requests 500/60s``."""
    tokens = (
        "tokens unlimited"
        if cfg.burst_tokens >= NO_TOKENS_LIMIT
        else f"burst {fmt_tokens(cfg.burst_tokens)} per {cfg.window_seconds:g} s (sliding)"
    )
    return ", ".join([tokens, *(format_limit(lim) for lim in cfg.limits)])


def machine() -> str:
    """One line naming the machine the figures came from."""
    import os

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


def finite(data):
    """``data`` with every infinite or NaN float as None: JSON has no such numbers (``Infinity`` is refused by
    strict parsers), and a ratio over nothing is no figure.

    Example:
        >>> finite({"a": [1.5, float("inf")], "b": (float("nan"), 2)})
        {'a': [1.5, None], 'b': [None, 2]}
    """
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data


def to_json(trace: Trace, cfg: SimConfig, results: list[SimResult], wall: float) -> dict:
    """The whole run as plain data (``--json``), every number finite (:func:`finite`). Keys are only ever added."""
    jobs = sum(r.jobs for r in results)
    # the estimator's figures (--estimator): over the `lane` policy's run, where it ran
    est = next((r.estimator for r in sorted(results, key=lambda r: r.policy != "lane") if r.estimator), None)
    return finite(
        {
            "scenario": scenario(trace, cfg),
            "results": [r.summary() for r in results],
            "wall_seconds": round(wall, 3),
            "jobs_per_s": round(jobs / wall, 1) if wall > 0 else None,
            "machine": machine(),
            "figures": {key: what for _, keys, what, _ in FIGURES for key in keys.split()},
            **({"estimator": est} if est is not None else {}),
        }
    )


def text_table(results: list[SimResult]) -> list[str]:
    """The figures as plain text lines: a column per policy, at most 80 wide for four policies."""
    rows = figures(results)
    names = [r.policy for r in results]
    label_w = max(len(label) for label, _ in rows)
    widths = [max(len(n), *(len(vals[i]) for _, vals in rows)) for i, n in enumerate(names)]
    out = [" " * label_w + "".join(f"  {n:>{w}}" for n, w in zip(names, widths))]
    out += [f"{label:<{label_w}}" + "".join(f"  {v:>{w}}" for v, w in zip(vals, widths)) for label, vals in rows]
    return out


def markdown_table(results: list[SimResult]) -> list[str]:
    """The figures as a markdown table, a column per policy."""
    out = ["| figure | " + " | ".join(f"`{r.policy}`" for r in results) + " |", "|---|" + "---:|" * len(results)]
    out += [f"| {label.strip()} | " + " | ".join(vals) + " |" for label, vals in figures(results)]
    return out


def print_table(trace: Trace, cfg: SimConfig, results: list[SimResult], wall: float, file=None) -> None:
    """The side-by-side table, what it means, and a one-line speed figure."""
    file = file if file is not None else sys.stdout
    sc = scenario(trace, cfg)
    wrap = textwrap.TextWrapper(width=WIDTH, subsequent_indent="  ")
    head = (
        f"{sc['source']}: {sc['jobs']:,} jobs over {sc['span_hours']:g} h, drift {sc['drift']}; "
        f"ceiling {fmt_tokens(cfg.ceiling)}, allowance {fmt_tokens(cfg.allowance)}"
        f"{', reset every ' + fmt_seconds(cfg.period_seconds) if cfg.period_seconds else ''}; "
        f"{_limits_text(cfg)}; max {cfg.max_leased} leases; "
        f"{cfg.workers} worker slot(s); {'runs chained' if cfg.chain else 'recorded arrivals'}"
    )
    lines = wrap.wrap(head) + [""] + text_table(results) + [""]
    notes = (
        f"top-10% = jobs with est >= {sc['top_decile_est_from']:,}; waits run from submission to the "
        f"worker's start; refused at intake: {sc['refused_at_intake']:,}; the clock stopped at "
        f"{fmt_seconds(max((r.end_s for r in results), default=0.0))}"
        f"{' (the horizon)' if cfg.horizon is not None else ''}"
        f"{'; stalled (jobs wait that nothing can ever admit: budget spent, no reset to come): ' + ', '.join(r.policy for r in results if r.stalled) if any(r.stalled for r in results) else ''}."
    )
    lines += wrap.wrap(notes)
    # The lane's, else the first.
    for r in sorted((r for r in results if r.estimator), key=lambda r: r.policy != "lane")[:1]:
        e = r.estimator
        if e["jobs"]:
            lines += wrap.wrap(
                f"estimator {e['name']} ({r.policy}'s run, re-estimated at submission; the header's drift and "
                f"top-10% are the trace's own estimates): drift {e['drift']:.3f}, {e['under_share']:.0%} "
                f"under-estimated, {e['overspend_share']:.1%} of tokens beyond estimates, p90 ratio "
                f"{e['p90_ratio']:.2f}, over {e['jobs']:,} jobs after {e['warmup']} of their stage settled."
            )
    for line in tenant_lines(results):
        lines += wrap.wrap(line) if line else [line]
    jobs = sum(r.jobs for r in results)
    lines.append(f"simulated {jobs:,} job-runs in {wall:.2f} s: {jobs / max(wall, 1e-9):,.0f} jobs/s")
    print("\n".join(lines), file=file)


def tenant_lines(results: list[SimResult]) -> list[str]:
    """Per policy, per tenant: share of the tokens, waits, runs finished; and the lane's fairness (the largest
    weighted-service gap between two backlogged tenants, Jain's index while several were backlogged)."""
    if not any(r.tenants for r in results):
        return []
    out = [
        "",
        "tenants (share of tokens settled; wait p50/p99; runs finished) and fairness (largest "
        "weighted-service gap between two backlogged tenants; Jain's index, 1 = fair):",
    ]
    for r in results:
        if not r.tenants:
            continue
        each = "; ".join(
            f"{name} (w {t['weight']:g}) {t['share']:.0%}, {fmt_seconds(t['wait_p50'])}/{fmt_seconds(t['wait_p99'])}, "
            f"{t['runs_finished']:,}/{t['runs']:,}"
            for name, t in sorted(r.tenants.items())
        )
        jain = "-" if r.jain is None else f"{r.jain:.3f}"
        out.append(f"  {r.policy}: {each}; gap {fmt_tokens(round(r.fair_gap or 0))}, Jain {jain}")
    return out


def _thin(xs: list, ys: list, most: int = 4_000) -> tuple[list, list]:
    step = max(1, len(xs) // most)
    return xs[::step], ys[::step]


def plot(trace: Trace, cfg: SimConfig, results: list[SimResult], path: str) -> None:
    """Spent tokens over time per policy against the ceiling, and wait by job size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
    for r in results:
        t, s = _thin(r.series_t, r.series_spent)
        ax1.plot([x / 3_600 for x in t], s, label=r.policy, linewidth=1, drawstyle="steps-post")
    ax1.axhline(cfg.ceiling, color="red", linestyle="--", linewidth=1, label="ceiling")
    ax1.axhline(cfg.allowance, color="black", linestyle=":", linewidth=1, label="allowance")
    ax1.set_xlabel("hours")
    ax1.set_ylabel("spent tokens" + (" (this period)" if cfg.period_seconds else ""))
    ax1.set_title("spent over time")
    ax1.legend(fontsize=8)

    ranked = sorted(range(len(trace)), key=trace.est.__getitem__)
    bins = [ranked[i * len(ranked) // 10 : (i + 1) * len(ranked) // 10] for i in range(10)]
    mids = [trace.est[b[len(b) // 2]] for b in bins if b]
    for r in results:
        p99 = []
        for b in bins:
            w = [r.waits[j] for j in b if j < len(r.waits) and r.waits[j] is not None]
            p99.append(max(percentile(w, 0.99), 1e-1) if w else math.nan)
        ax2.plot(mids, p99, marker="o", label=r.policy, linewidth=1)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("job estimate (tokens, decile median)")
    ax2.set_ylabel("p99 wait (s)")
    ax2.set_title("wait by job size (admitted or still waiting)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
