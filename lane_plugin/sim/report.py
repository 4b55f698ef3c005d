"""Showing ``lane simulate`` results: a rich table, JSON, and a two-panel plot.

matplotlib is imported only by :func:`plot`, rich only by :func:`print_table`.
"""

from __future__ import annotations

import math
import platform
from dataclasses import asdict

from .engine import SimConfig, refused_at_intake
from .results import SimResult, big_threshold, percentile
from .traffic import Trace

COLUMNS = (
    "policy", "done", "spent", "over ceiling", "over allowance", "busy %", "wait p50", "wait p99",
    "top-10% p50", "top-10% p99", "starved", "parked", "expired leases", "jobs/s",
)  # fmt: skip


def fmt_seconds(s: float) -> str:
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
    """900, 45.0k, 12.35M."""
    if abs(n) >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if abs(n) >= 10_000:
        return f"{n / 1e3:.1f}k"
    return str(n)


def rows(results: list[SimResult]) -> list[list[str]]:
    """One formatted row per policy, in :data:`COLUMNS` order."""
    return [
        [
            r.policy, f"{r.done:,}", fmt_tokens(r.spent), fmt_tokens(r.over_ceiling), fmt_tokens(r.over_allowance),
            f"{r.busy_pct:.1f}", fmt_seconds(r.wait_p50), fmt_seconds(r.wait_p99), fmt_seconds(r.big_wait_p50),
            fmt_seconds(r.big_wait_p99), f"{r.starved:,}", f"{r.parked:,}", f"{r.expired:,}", f"{r.jobs_per_s:,.0f}",
        ]  # fmt: skip
        for r in results
    ]


def scenario(trace: Trace, cfg: SimConfig) -> dict:
    """What was simulated: the traffic and every lane/worker setting."""
    refused = refused_at_intake(trace, cfg)
    return {
        "source": trace.source,
        "jobs": len(trace),
        "refused_at_intake": sum(refused),
        "span_hours": round(trace.span / 3_600, 2),
        "est_tokens": sum(trace.est),
        "actual_tokens": sum(trace.actual),
        "drift": round(sum(trace.actual) / max(sum(trace.est), 1), 3),
        "top_decile_est_from": big_threshold(trace, refused),
        "config": asdict(cfg),
    }


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
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def to_json(trace: Trace, cfg: SimConfig, results: list[SimResult], wall: float) -> dict:
    """The whole run as plain data (``--json``)."""
    jobs = sum(r.jobs for r in results)
    return {
        "scenario": scenario(trace, cfg),
        "results": [r.summary() for r in results],
        "wall_seconds": round(wall, 3),
        "jobs_per_s": round(jobs / wall, 1) if wall > 0 else None,
        "machine": machine(),
    }


def print_table(trace: Trace, cfg: SimConfig, results: list[SimResult], wall: float, console=None) -> None:
    """The side-by-side table and a one-line speed figure."""
    from rich.console import Console
    from rich.table import Table

    sc = scenario(trace, cfg)
    title = (
        f"{sc['source']}: {sc['jobs']:,} jobs over {sc['span_hours']:g} h, drift {sc['drift']}; "
        f"ceiling {fmt_tokens(cfg.ceiling)}, allowance {fmt_tokens(cfg.allowance)}"
    )
    table = Table(title=title, title_justify="left")
    for i, c in enumerate(COLUMNS):
        table.add_column(c, justify="left" if i == 0 else "right")
    for r in rows(results):
        table.add_row(*r)
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=200)
    console.print(table)
    jobs = sum(r.jobs for r in results)
    console.print(
        f"top-10% = jobs with est >= {sc['top_decile_est_from']:,}; waits of never-admitted jobs count up to the "
        f"horizon; starved = never admitted, overtaken by a later job, waited >= {fmt_seconds(cfg.starve_after)}; "
        f"refused at intake: {sc['refused_at_intake']:,}",
        soft_wrap=True,
    )
    console.print(f"simulated {jobs:,} job-runs in {wall:.2f} s: {jobs / max(wall, 1e-9):,.0f} jobs/s")


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
    bins = [ranked[i * len(ranked) // 10:(i + 1) * len(ranked) // 10] for i in range(10)]
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
    ax2.set_title("wait by job size")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
