"""The data quality report: one self-contained HTML page under ``<root>/reports/``.

It answers "can the data be trusted today, what went wrong, and since when" for the last
``quality_report_days``: the verdict per suite over time (``quality.results``), quarantine
volume by reason (``silver.quarantine``), freshness lag per layer, hourly volume against
its trailing baseline, late rows (``ops.late_data``), and the failing expectations with a
link to their Data Docs page. Plots are drawn with matplotlib into inline SVG, so the page
needs no network and no JavaScript.

``measure`` reads the tables with Spark; ``render`` turns the measures into HTML and is pure.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs import delta_reader
from spark_jobs.config import Settings, interval_seconds
from spark_jobs.datasets import DATA_TABLES, REFERENCE_TABLES
from spark_jobs.gold import campaign_stats, watermark
from spark_jobs.quality import results

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession

    from spark_jobs.quality.validate import ValidationRun

HOUR_BAR = 0.8 / 24  # an hour in matplotlib's day units, less a gap
BASELINE_HOURS = 24  # the trailing window of the volume baseline, as in the suites
COLORS = {"passed": "#2e7d32", "warning": "#ed8b00", "failed": "#c62828"}
STYLE = """
:root { color-scheme: light; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1b1f24;
       margin: 0 auto; max-width: 1180px; padding: 1.2rem 1.5rem 3rem; }
h1 { font-size: 1.5rem; margin: 0 0 .2rem; } h2 { font-size: 1.15rem; margin: 2rem 0 .5rem; }
.meta { color: #57606a; margin: 0 0 1rem; }
.verdict { padding: .7rem 1rem; border-radius: 6px; font-weight: 600; }
.verdict.passed { background: #e8f5e9; color: #1b5e20; }
.verdict.warning { background: #fff4e0; color: #8a4b00; }
.verdict.failed { background: #fdecea; color: #8e1c1c; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { padding: .35rem .55rem; border-bottom: 1px solid #d0d7de; text-align: left;
         vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.badge { display: inline-block; padding: 0 .45rem; border-radius: 4px; color: #fff;
         font-size: .8rem; }
.critical { background: #c62828; } .warning { background: #ed8b00; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 1rem;
        align-items: start; }
figure { margin: 0; } figure svg { width: 100%; max-width: 880px; height: auto; }
figcaption { color: #57606a; font-size: .85rem; }
.empty { color: #57606a; font-style: italic; }
nav a { margin-right: .9rem; }
"""


@dataclass
class Measures:
    """What the report shows, as small pandas frames (one row per plotted point)."""

    generated_at: datetime
    days: int
    suite_runs: pd.DataFrame  # run_at, suite, status
    failures: pd.DataFrame  # suite, severity, description, unexpected_count, observed, details
    quarantine: pd.DataFrame  # hour, reason, rows
    freshness: pd.DataFrame  # layer, lag_minutes, meaning
    volume: pd.DataFrame  # layer, hour, rows, baseline
    late: pd.DataFrame  # event_date, layer, late_rows, repaired


def measure(spark: SparkSession, settings: Settings, run: ValidationRun | None = None
            ) -> Measures:
    """The report's figures from the tables (the run's results are in ``quality.results``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    now = datetime.now(UTC).replace(tzinfo=None)
    since = now - timedelta(days=settings.quality_report_days)

    def table(name: str):  # noqa: ANN202 - a DataFrame
        spec = {**DATA_TABLES, **REFERENCE_TABLES, results.TABLE.name: results.TABLE}[name]
        return spark.read.format("delta").load(spec.path(settings))

    history = table("quality.results").where(F.col("run_at") >= F.lit(since))
    suite_runs = (history.groupBy("run_at", "suite").agg(
        F.max(F.when(~F.col("success") & (F.col("severity") == "critical"), 1)).alias("c"),
        F.max(F.when(~F.col("success") & (F.col("severity") == "warning"), 1)).alias("w"))
        .select("run_at", "suite", F.when(F.col("c") == 1, "failed")
                .when(F.col("w") == 1, "warning").otherwise("passed").alias("status"))
        .orderBy("run_at").toPandas())
    latest_run = (history.agg(F.max("run_at")).first()[0] if run is None else run.run_at)
    failures = (history.where((F.col("run_at") == F.lit(latest_run)) & ~F.col("success"))
                .select("suite", "severity", "description", "unexpected_count", "observed",
                        "error", "details")
                .orderBy(F.col("severity"), "suite").toPandas())

    hour = F.date_trunc("HOUR", "ingested_at").alias("hour")
    quarantine = (table("silver.quarantine").where(F.col("ingested_at") >= F.lit(since))
                  .groupBy(hour, "reason").agg(F.count("*").alias("rows"))
                  .orderBy("hour").toPandas())

    trailing = (Window.orderBy(F.unix_seconds("hour"))
                .rangeBetween(-BASELINE_HOURS * 3600, -3600))
    volume_frames = []
    for layer, name in (("bronze", "bronze.ad_events"), ("silver", "silver.ad_events")):
        hourly = (table(name).where(F.col("ingested_at") >= F.lit(since - timedelta(days=1)))
                  .groupBy(hour).agg(F.count("*").alias("rows"))
                  .withColumn("baseline", F.avg("rows").over(trailing))
                  .where(F.col("hour") >= F.lit(since))
                  .withColumn("layer", F.lit(layer)))
        volume_frames.append(hourly)
    volume = volume_frames[0].unionByName(volume_frames[1]).orderBy("hour").toPandas()

    late = (table("ops.late_data").where(F.col("event_date") >= F.lit(since.date()))
            .groupBy("event_date", "layer",
                     F.col("repaired_at").isNotNull().alias("repaired"))
            .agg(F.sum("late_rows").alias("late_rows")).orderBy("event_date").toPandas())

    return Measures(now, settings.quality_report_days, suite_runs, failures, quarantine,
                    freshness(spark, settings, now), volume, late)


def freshness(spark: SparkSession, settings: Settings, now: datetime) -> pd.DataFrame:
    """How far behind each layer is: bronze behind the clock, silver behind bronze (what it
    has placed, as an event or in quarantine), gold's closed windows behind silver."""
    import pandas as pd

    def newest(sql: str) -> datetime | None:
        return spark.sql(sql).first()[0]

    def path(name: str) -> str:
        return f"delta.`{({**DATA_TABLES, **REFERENCE_TABLES})[name].path(settings)}`"

    bronze = newest(f"SELECT max(ingested_at) FROM {path('bronze.ad_events')}")
    silver = newest(f"SELECT max(ingested_at) FROM (SELECT ingested_at FROM "
                    f"{path('silver.ad_events')} UNION ALL SELECT ingested_at FROM "
                    f"{path('silver.quarantine')})")
    events = newest(f"SELECT max(event_time) FROM {path('silver.ad_events')}")
    gold = campaign_stats.TABLE.path(settings)
    latest = (watermark.latest_committed(gold) if delta_reader.is_delta_table(gold)
              else None)
    closed = (None if latest is None else watermark.naive_utc(latest)
              - timedelta(seconds=interval_seconds(settings.watermark_delay)))

    def minutes(later: datetime | None, earlier: datetime | None) -> float | None:
        if later is None or earlier is None:
            return None
        return max((later - earlier).total_seconds() / 60, 0.0)

    return pd.DataFrame([
        ("bronze", minutes(now, bronze), "since the newest record received"),
        ("silver", minutes(bronze, silver), "behind bronze's newest record"),
        ("gold", minutes(events, closed), "closed windows behind silver's newest event"),
    ], columns=["layer", "lag_minutes", "meaning"])


# -- rendering -----------------------------------------------------------------------------


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
    locator = mdates.AutoDateLocator(maxticks=8)
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def _chart(plot_id: str, caption: str, svg: str | None) -> str:
    body = svg if svg is not None else "<p class='empty'>no data in this period</p>"
    return (f"<figure class='plot' id='{plot_id}'>{body}"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


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


def _cell(value: object, numeric: bool = False) -> str:
    text = "–" if value is None or value != value else html.escape(str(value))
    return f"<td class='num'>{text}</td>" if numeric else f"<td>{text}</td>"


def _failures_table(failures: pd.DataFrame) -> str:
    if failures.empty:
        return "<p class='empty'>Every expectation of the latest run passed.</p>"
    rows = []
    for f in failures.itertuples():
        link = (f"<a href='{html.escape(f.details)}'>details</a>" if f.details else "–")
        what = (f"could not be evaluated: {f.error[:300]}" if f.error
                else (f.observed or "")[:300])
        unexpected = None if f.unexpected_count != f.unexpected_count else f.unexpected_count
        rows.append(f"<tr class='failure'><td><span class='badge {f.severity}'>{f.severity}"
                    f"</span></td>{_cell(f.suite)}{_cell(f.description)}"
                    f"{_cell(unexpected, True)}"
                    f"<td><code>{html.escape(what)}</code></td><td>{link}</td></tr>")
    return ("<table><tr><th>severity</th><th>suite</th><th>expectation</th>"
            "<th>unexpected</th><th>observed</th><th>Data Docs</th></tr>"
            + "".join(rows) + "</table>")


def _rounded(value: float | None) -> float | None:
    return None if value is None or value != value else round(value, 1)


def _verdict(measures: Measures, run: ValidationRun | None) -> tuple[str, str]:
    if run is None:
        return "warning", "No validation ran with this report."
    critical = sum(len(v.failed("critical")) for v in run.verdicts)
    warnings = sum(len(v.failed("warning")) for v in run.verdicts)
    if critical:
        return "failed", (f"Do not trust the data yet: {critical} critical expectation(s) "
                          f"failed, {warnings} warning(s).")
    if warnings:
        return "warning", f"Usable, with {warnings} warning(s) to look at."
    return "passed", "Every expectation passed."


def render(measures: Measures, run: ValidationRun | None = None) -> str:
    """The report page; pure (no I/O), so it can be tested on hand-made measures."""
    status, headline = _verdict(measures, run)
    suites = "".join(
        f"<tr><td>{html.escape(v.table)}</td><td>{html.escape(v.grain)}</td>"
        f"<td class='num'>{len(v.results)}</td>"
        f"<td class='num'>{len(v.failed('critical'))}</td>"
        f"<td class='num'>{len(v.failed('warning'))}</td></tr>"
        for v in (run.verdicts if run else []))
    scope = ("whole tables" if run is None or run.first is None
             else f"event dates {run.first} to {run.last}")
    fresh_rows = "".join(
        f"<tr><td>{html.escape(r.layer)}</td>{_cell(_rounded(r.lag_minutes), True)}"
        f"<td>{html.escape(r.meaning)}</td></tr>" for r in measures.freshness.itertuples())
    sections = [
        ("suites", "Suites over time",
         "<table><tr><th>suite</th><th>grain</th><th>expectations</th><th>critical failed</th>"
         f"<th>warnings</th></tr>{suites}</table>"
         + _chart("plot-suites", "Each square is one validation run of a suite.",
                  suite_history_chart(measures.suite_runs))),
        ("failures", "Failing expectations (latest run)", _failures_table(measures.failures)),
        ("quarantine", "Quarantine", _chart(
            "plot-quarantine", "Rejected records by reason code, per ingestion hour.",
            quarantine_chart(measures.quarantine))),
        ("freshness", "Freshness", "<div class='grid'>" + _chart(
            "plot-freshness", "Minutes each layer trails the one before it.",
            freshness_chart(measures.freshness))
         + f"<table><tr><th>layer</th><th>lag (min)</th><th>measured as</th></tr>{fresh_rows}"
           "</table></div>"),
        ("volume", "Volume", _chart(
            "plot-volume", "Records per ingestion hour; dashed: the mean of the previous 24 "
            "non-empty hours.", volume_chart(measures.volume))),
        ("late", "Late data", _chart(
            "plot-late", "Events later than the watermark, per event date: reprocessing "
            "(lakehouse reprocess --late) repairs them.", late_chart(measures.late))),
    ]
    nav = "".join(f"<a href='#{key}'>{html.escape(title)}</a>" for key, title, _ in sections)
    body = "".join(f"<section id='{key}'><h2>{html.escape(title)}</h2>{content}</section>"
                   for key, title, content in sections)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>Data quality – {measures.generated_at:%Y-%m-%d %H:%M} UTC</title>"
        f"<style>{STYLE}</style></head><body>"
        "<h1>Lakehouse data quality</h1>"
        f"<p class='meta'>Generated {measures.generated_at:%Y-%m-%d %H:%M:%S} UTC; validated "
        f"{scope}; history of the last {measures.days} days. "
        "<a href='data_docs/index.html'>Great Expectations Data Docs</a></p>"
        f"<p class='verdict {status}' id='verdict'>{html.escape(headline)}</p>"
        f"<nav>{nav}</nav>{body}</body></html>")


def write(settings: Settings, page: str, generated_at: datetime) -> Path:
    """Write the page as ``<root>/reports/quality-<UTC time>.html``; return its path."""
    settings.reports_dir.mkdir(parents=True, exist_ok=True)
    path = settings.reports_dir / f"quality-{generated_at:%Y%m%dT%H%M%SZ}.html"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(page, "utf-8")
    temporary.replace(path)  # the UI never serves a half-written report
    return path
