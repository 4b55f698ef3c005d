"""Drift over time as a PNG (matplotlib, Agg backend: no display needed).

Example:
    >>> from lane_plugin.reports import drift_over_time
    >>> plot_drift(drift_over_time(led, since="7d"), "drift.png")   # doctest: +SKIP
    'drift.png'
"""

from __future__ import annotations

import os

from ..errors import InvalidInput
from .drift import HIGH


def plot_drift(series, path: str | os.PathLike, *, title: str = "Drift per stage (sum actual / sum est)") -> str:
    """Draw drift per group over time with the 1.0 (honest) and 1.5 (overspending) lines.

    Args:
        series: a frame from :func:`lane_plugin.reports.drift_over_time`
            (first column the group, then ``bucket``, ``jobs``, ``drift``).
        path: where to write the PNG (its directory is created).
        title: the chart title.

    Returns:
        The path written, as a string.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import datetime as dt

    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    path = os.fspath(path)
    if not path.lower().endswith(".png"):
        raise InvalidInput("plot", path, "expected a .png path")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    group = series.columns[0] if len(series.columns) else "stage"
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        for name, part in series.groupby(group, sort=True):
            when = [dt.datetime.fromtimestamp(t, dt.timezone.utc) for t in part["bucket"]]
            ax.plot(when, part["drift"], marker="o", markersize=3, linewidth=1.5, label=str(name))
        ax.axhline(1.0, color="green", linestyle="--", linewidth=1, label="1.0 honest")
        ax.axhline(HIGH, color="red", linestyle="--", linewidth=1, label=f"{HIGH} overspending")
        top = max([HIGH * 1.2] + [float(v) for v in series["drift"]]) if len(series) else HIGH * 1.2
        ax.set_ylim(0, top * 1.05)
        ax.set_ylabel("drift")
        ax.set_xlabel("finished (UTC)")
        ax.set_title(title if len(series) else title + " -- no settled jobs")
        locator = mdates.AutoDateLocator()  # minutes-long runs get seconds, weeks get days
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        fig.autofmt_xdate()
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8, ncol=2)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
