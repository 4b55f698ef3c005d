"""Drift and budget over time as a PNG (matplotlib, Agg backend: no display needed).

Example:
    >>> from lane_plugin.reports import drift_over_time, spend_over_time
    >>> plot_drift(drift_over_time(led, since="7d"), "drift.png", spend=spend_over_time(led, since="7d"))  # doctest: +SKIP
    'drift.png'
"""

from __future__ import annotations

import os

from ..errors import InvalidInput
from .drift import HIGH


def time_axis(ax, times) -> str:
    """Format a UTC time axis so every tick says what it is; returns the axis label (with its units)."""
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    span = (max(times) - min(times)).total_seconds() if times else 0.0
    if times and span < 60:
        # one point (or a burst within a minute): matplotlib would widen the axis to whole days, every tick 00:00
        import datetime as dt

        pad = dt.timedelta(minutes=5)
        ax.set_xlim(min(times) - pad, max(times) + pad)
        locator, span = mdates.MinuteLocator(interval=2), 600.0
    if span <= 2 * 86400:
        fmt, unit = "%H:%M", "hours:minutes"
        if span < 600:
            fmt, unit = "%H:%M:%S", "hours:minutes:seconds"
        day = min(times).strftime("%Y-%m-%d") if times else ""
        label = f"time finished, UTC ({unit}{', ' + day if day else ''})"
    else:
        fmt, label = "%b %d %H:%M", "time finished, UTC (month day hours:minutes)"
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.DateFormatter(fmt))
    return label


def plot_drift(
    series, path: str | os.PathLike, *, title: str = "Drift per stage (sum actual / sum est)", spend=None
) -> str:
    """Draw drift per group over time with the 1.0 and 1.5 lines and, given ``spend``, each lane's budget.

    Args:
        series: a frame from :func:`lane_plugin.reports.drift_over_time`
            (first column the group, then ``bucket``, ``jobs``, ``drift``).
        path: where to write the PNG (its directory is created).
        title: the chart title.
        spend: optional frame from :func:`lane_plugin.reports.spend_over_time`: a second
            panel with each lane's spend as % of its ceiling, the ceiling (100%) and
            each lane's start limit as lines.

    Legends sit outside the plotted area, so they never cover the data.

    Returns:
        The path written, as a string.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import datetime as dt

    import matplotlib.pyplot as plt

    path = os.fspath(path)
    if not path.lower().endswith(".png"):
        raise InvalidInput("plot", path, "expected a .png path")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    group = series.columns[0] if len(series.columns) else "stage"
    budget = spend is not None and len(spend)
    fig, axes = plt.subplots(
        2 if budget else 1, 1, figsize=(10, 7 if budget else 4.5), dpi=100, sharex=True, squeeze=False
    )
    ax = axes[0][0]
    times = []
    try:
        for name, part in series.groupby(group, sort=True):
            when = [dt.datetime.fromtimestamp(t, dt.timezone.utc) for t in part["bucket"]]
            times += when
            ax.plot(when, part["drift"], marker="o", markersize=3, linewidth=1.5, label=str(name))
        ax.axhline(1.0, color="green", linestyle="--", linewidth=1, label="1.0 honest")
        ax.axhline(HIGH, color="red", linestyle="--", linewidth=1, label=f"{HIGH} overspending")
        top = max([HIGH * 1.2] + [float(v) for v in series["drift"]]) if len(series) else HIGH * 1.2
        ax.set_ylim(0, top * 1.05)
        ax.set_ylabel("drift (actual / estimate)")
        ax.set_title(title if len(series) else title + ": no settled jobs")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize=8, title=group)
        low_ax = ax
        if budget:
            bx = axes[1][0]
            for i, (lane, part) in enumerate(spend.groupby("lane", sort=True)):
                color = f"C{i}"
                when = [dt.datetime.fromtimestamp(t, dt.timezone.utc) for t in part["t"]]
                times += when
                bx.step(when, part["pct_of_ceiling"], where="post", color=color, linewidth=1.5, label=f"{lane} spent")
                start = float(part["start_pct"].iloc[0])
                if start < 100.0:
                    bx.axhline(start, color=color, linestyle=":", linewidth=1, label=f"{lane} start limit ({start:g}%)")
            bx.axhline(100.0, color="black", linestyle="--", linewidth=1, label="ceiling (100%)")
            bx.set_ylim(0, max(105.0, float(spend["pct_of_ceiling"].max()) * 1.05))
            bx.set_ylabel("spent, % of ceiling")
            bx.set_title("Budget: tokens billed this period, as % of each lane's ceiling")
            bx.grid(alpha=0.3)
            bx.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize=8)
            low_ax = bx
        low_ax.set_xlabel(time_axis(low_ax, times))
        fig.autofmt_xdate()
        fig.savefig(path, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)
    return path
