"""The data quality report's plots: matplotlib figures drawn into inline SVG, so the page
needs no network and no JavaScript. Each chart takes one of the report's measures (a small
pandas frame) and returns the SVG markup, or None when the frame is empty."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

HOUR_BAR = 0.8 / 24  # an hour in matplotlib's day units, less a gap
COLORS = {"passed": "#2e7d32", "warning": "#ed8b00", "failed": "#c62828"}


def _svg(figure) -> str:  # noqa: ANN001 - a matplotlib Figure
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _figure(title: str):  # noqa: ANN202 - (Figure, Axes)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.2, 3.0))
    axes.set_title(title, fontsize=11, loc="left")
    axes.spines[["top", "right"]].set_visible(False)
    axes.grid(axis="y", color="#e5e7eb")
    axes.set_axisbelow(True)
    return figure, axes


# A time axis spans at least this many days: a lone point or hour gets the two hours around
# it, not the years matplotlib's autoscale would stretch it over.
MIN_TIME_SPAN_DAYS = 2 / 24


def _time_axis(axes) -> None:  # noqa: ANN001
    import matplotlib.dates as mdates

    low, high = axes.dataLim.intervalx
    if low <= high and high - low < MIN_TIME_SPAN_DAYS:
        middle = (low + high) / 2
        axes.set_xlim(middle - MIN_TIME_SPAN_DAYS / 2, middle + MIN_TIME_SPAN_DAYS / 2)
    # At least three ticks, not matplotlib's five: over three to five days five daily ticks
    # do not fit, hourly ones need more than eight, and the locator warned in every report
    # ("unable to pick an appropriate interval") before falling back to nine ticks.
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def suite_history_chart(suite_runs: pd.DataFrame) -> str | None:
    if suite_runs.empty:
        return None
    figure, axes = _figure("Suite verdict per run")
    suites = sorted(suite_runs["suite"].unique())
    for status, color in COLORS.items():
        points = suite_runs[suite_runs["status"] == status]
        axes.scatter(points["run_at"], points["suite"].map(suites.index), s=42, color=color,
                     label=status, marker="s")
    axes.set_yticks(range(len(suites)), suites)
    axes.set_ylim(-0.6, len(suites) - 0.4)
    return _finish(figure, axes)


def quarantine_chart(quarantine: pd.DataFrame) -> str | None:
    if quarantine.empty:
        return None
    figure, axes = _figure("Quarantined records per hour, by reason")
    _stacked_bars(axes, quarantine.pivot_table(index="hour", columns="reason", values="rows",
                                               aggfunc="sum", fill_value=0), HOUR_BAR)
    return _finish(figure, axes)


def freshness_chart(fresh: pd.DataFrame) -> str | None:
    known = fresh.dropna(subset=["lag_minutes"])
    if known.empty:
        return None
    figure, axes = _figure("Freshness lag per layer (minutes)")
    bars = axes.barh(known["layer"], known["lag_minutes"], color="#1f77b4")
    axes.bar_label(bars, labels=[f"{v:,.1f}" for v in known["lag_minutes"]], padding=3,
                   fontsize=9)
    axes.invert_yaxis()
    axes.grid(axis="x", color="#e5e7eb")
    return _svg(figure)


def volume_chart(volume: pd.DataFrame) -> str | None:
    if volume.empty:
        return None
    figure, axes = _figure("Records per hour against the trailing 24-hour baseline")
    for layer, color in (("bronze", "#6d4c41"), ("silver", "#1f77b4")):
        rows = volume[volume["layer"] == layer]
        axes.plot(rows["hour"], rows["rows"], marker="o", markersize=3, color=color,
                  label=f"{layer} records")
        axes.plot(rows["hour"], rows["baseline"], linestyle="--", color=color, alpha=0.6,
                  label=f"{layer} baseline")
    return _finish(figure, axes)


def late_chart(late: pd.DataFrame) -> str | None:
    if late.empty:
        return None
    figure, axes = _figure("Late rows per event date (not included by streaming)")
    table = late.assign(state=late["repaired"].map({True: "repaired", False: "unrepaired"}))
    _stacked_bars(axes, table.pivot_table(index="event_date", columns="state",
                                          values="late_rows", aggfunc="sum", fill_value=0),
                  0.8, {"repaired": "#9e9e9e", "unrepaired": "#c62828"})
    return _finish(figure, axes)


def _stacked_bars(axes, table: pd.DataFrame, width: float,  # noqa: ANN001
                  colors: dict[str, str] | None = None) -> None:
    """One bar per index value, one stacked segment per column."""
    bottom = None
    for column in table.columns:
        axes.bar(table.index, table[column], width=width, bottom=bottom, label=column,
                 color=(colors or {}).get(column))
        bottom = table[column] if bottom is None else bottom + table[column]


def _finish(figure, axes) -> str:  # noqa: ANN001
    """Legend beside the plot, readable time ticks, and the figure as SVG."""
    axes.legend(loc="upper left", bbox_to_anchor=(1, 1), frameon=False, fontsize=8)
    _time_axis(axes)
    return _svg(figure)
