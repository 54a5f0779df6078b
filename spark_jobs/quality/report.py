"""The data quality report: one self-contained HTML page under ``<root>/reports/``.

It answers "can the data be trusted today, what went wrong, and since when" for the last
``quality_report_days``: the verdict per suite over time (``quality.results``), quarantine
volume by reason (``silver.quarantine``), freshness lag per layer, hourly volume against
its trailing baseline, late rows (``ops.late_data``), and the failing expectations with a
link to their Data Docs page. Plots are drawn with matplotlib into inline SVG (``plots``),
so the page needs no network and no JavaScript.

``measure`` reads the tables with Spark; ``render`` fills ``templates/report.html.j2`` with
the measures and is pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from markupsafe import Markup

from spark_jobs import delta_reader, pages, storage
from spark_jobs.config import Settings
from spark_jobs.datasets import TABLES
from spark_jobs.gold import campaign_stats, watermark
from spark_jobs.quality import plots
from spark_jobs.tables import read as read_table

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession

    from spark_jobs.quality.validate import ValidationRun

BASELINE_HOURS = 24  # the trailing window of the volume baseline, as in the suites


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
        return read_table(spark, settings, TABLES[name])

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
        return f"delta.`{TABLES[name].path(settings)}`"

    bronze = newest(f"SELECT max(ingested_at) FROM {path('bronze.ad_events')}")
    silver = newest(f"SELECT max(ingested_at) FROM (SELECT ingested_at FROM "
                    f"{path('silver.ad_events')} UNION ALL SELECT ingested_at FROM "
                    f"{path('silver.quarantine')})")
    events = newest(f"SELECT max(event_time) FROM {path('silver.ad_events')}")
    gold = campaign_stats.TABLE.path(settings)
    latest = (watermark.latest_committed(gold) if delta_reader.is_delta_table(gold)
              else None)
    applied = watermark.applied(latest, settings.watermark_delay)
    closed = None if applied is None else watermark.naive_utc(applied)

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


def _whole(value: float | None) -> int | None:
    """A count read as a float (NaN or None where absent) as the integer it is."""
    return None if value is None or value != value else int(value)


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
    suites = [{"table": v.table, "grain": v.grain, "expectations": len(v.results),
               "critical": len(v.failed("critical")), "warnings": len(v.failed("warning"))}
              for v in (run.verdicts if run else [])]
    failures = [{"severity": f.severity, "suite": f.suite, "description": f.description,
                 "unexpected": _whole(f.unexpected_count), "details": f.details,
                 "observed": (f"could not be evaluated: {f.error[:300]}" if f.error
                              else (f.observed or "")[:300])}
                for f in measures.failures.itertuples()]
    freshness_rows = [{"layer": r.layer, "lag_minutes": _rounded(r.lag_minutes),
                       "meaning": r.meaning} for r in measures.freshness.itertuples()]
    # matplotlib's own SVG, the one markup the page takes as it is.
    svg = {name: None if drawn is None else Markup(drawn) for name, drawn in (
        ("suites", plots.suite_history_chart(measures.suite_runs)),
        ("quarantine", plots.quarantine_chart(measures.quarantine)),
        ("freshness", plots.freshness_chart(measures.freshness)),
        ("volume", plots.volume_chart(measures.volume)),
        ("late", plots.late_chart(measures.late)))}
    scope = ("whole tables" if run is None or run.first is None
             else f"event dates {run.first} to {run.last}")
    return pages.render(__package__, "report.html.j2", generated_at=measures.generated_at,
                        days=measures.days, scope=scope, status=status, headline=headline,
                        suites=suites, failures=failures, freshness=freshness_rows, plots=svg)


def write(settings: Settings, page: str, generated_at: datetime) -> Path:
    """Write the page as ``<root>/reports/quality-<UTC time>.html``; return its path."""
    settings.reports_dir.mkdir(parents=True, exist_ok=True)
    path = settings.reports_dir / f"quality-{generated_at:%Y%m%dT%H%M%SZ}.html"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(page, "utf-8")
    storage.replace(temporary, path)  # the UI never serves a half-written report
    return path
