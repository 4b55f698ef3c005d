"""Reports on a ledger: drift (estimate against actual, pandas) and its plot over time."""

from .drift import (
    GROUPS,
    HIGH,
    LOW,
    advice,
    done_jobs,
    drift,
    drift_over_time,
    parse_since,
    ratio2,
    render,
    round2,
    spend_over_time,
    summary_markdown,
    verdict,
    version_jobs,
    worst,
)
from .plots import plot_drift

__all__ = [
    "GROUPS",
    "HIGH",
    "LOW",
    "advice",
    "done_jobs",
    "drift",
    "drift_over_time",
    "parse_since",
    "plot_drift",
    "ratio2",
    "render",
    "round2",
    "spend_over_time",
    "summary_markdown",
    "verdict",
    "version_jobs",
    "worst",
]
