"""Reports on a ledger: drift (estimate against actual, pandas), its summary in words and its plot over time."""

from .drift import (
    GROUPS,
    HIGH,
    LOW,
    done_jobs,
    drift,
    drift_over_time,
    parse_since,
    ratio2,
    render,
    round2,
    spend_over_time,
    verdict,
    version_jobs,
)
from .plots import plot_drift
from .summary import advice, summary_markdown, worst

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
