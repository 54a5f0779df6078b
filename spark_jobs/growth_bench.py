"""Silver's per-batch cost against the size of silver.

One micro-batch of a steady feed (20,000 events from the generator with its default mess,
event times in the minute before their ingestion, 2% late by minutes to days) goes
through silver's own batch function, ``silver.process``, into:

- an empty silver;
- silver already holding N rows spread over the 30 days before the batch (months of a
  steady feed);
- silver already holding N rows in the 24 hours before the batch (a busy day: the batch's
  own dates hold N events).

The seeded rows lie in files in event-time order, as a stream leaves them. Each case is
measured ``repetitions`` times after a warm-up; after each, silver is restored to its
seeded version, so every measurement inserts the same new events.
"""

from __future__ import annotations

import shutil
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import landing_feed
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import Settings
from spark_jobs.silver import ad_events as silver
from spark_jobs.silver import quarantine
from spark_jobs.tables import ensure_table

HISTORY_DAYS = 30
ADS = 400  # distinct ad ids of the synthetic rows
SEED_SLICE = 500_000  # rows per append when seeding silver


def silver_rows(spark: SparkSession, first: int, count: int, start: datetime,
                span: timedelta, *, in_order: bool = False) -> DataFrame:
    """``count`` valid silver rows, event ids ``e-<first>`` on, over ``span`` of event time
    from ``start``: in id order (as a stream writes them), or scattered across the span
    (as late and early events are)."""
    rows = spark.range(first, first + count)
    seconds = max(int(span.total_seconds()), 1)
    offset = ((F.col("id") - first) * seconds / count if in_order
              else (F.col("id") * 7919) % seconds)
    when = F.timestamp_seconds(F.lit(int(start.timestamp())) + offset)
    return rows.select(
        F.concat(F.lit("e-"), F.col("id").cast("string")).alias("event_id"),
        when.alias("event_time"), F.to_date(when).alias("event_date"),
        F.element_at(F.array(F.lit("view"), F.lit("click"), F.lit("purchase")),
                     (F.col("id") % 3 + 1).cast("int")).alias("event_type"),
        F.concat(F.lit("u-"), (F.col("id") % 5000).cast("string")).alias("user_id"),
        F.lit("p-1").alias("page_id"),
        F.concat(F.lit("ad-"), ((F.col("id") * 31) % ADS).cast("string")).alias("ad_id"),
        F.lit("banner").alias("ad_type"), F.lit("10.0.0.1").alias("ip_address"),
        F.when(F.col("id") % 3 == 2, F.lit(9.99)).cast("decimal(12,2)").alias("price"),
        F.lit(None).cast("string").alias("_rescued"), F.lit(False).alias("event_id_derived"),
        F.concat(F.lit("file:bench:"), F.col("id").cast("string")).alias("bronze_id"),
        F.lit("file").alias("source"), when.alias("ingested_at"))


def bronze_batch(spark: SparkSession, generated: Settings, events: int) -> DataFrame:
    """A minute of a steady feed, landed as one file in the fresh root of ``generated``,
    as bronze rows: the silver stream's micro-batch input."""
    shutil.rmtree(generated.root, ignore_errors=True)
    landing_feed.generate(generated.root, "--events", str(events), "--seed", "11",
                          "--events-per-file", str(events), "--span", "1 minute")
    files = (spark.read.option("wholetext", "true").text(str(generated.landing_events))
             .select("value", F.col("_metadata.file_path").alias("file_path")))
    return bronze.lines_from_files(files)


def _seed(spark: SparkSession, settings: Settings, rows: int, start: datetime,
          span: timedelta) -> int:
    """A fresh silver holding ``rows`` rows; its version."""
    shutil.rmtree(settings.root, ignore_errors=True)
    for table in (silver.TABLE, quarantine.TABLE):
        ensure_table(spark, settings, table)
    path = silver.TABLE.path(settings)
    if rows:
        # Written in slices of event time, as a stream writes many files per date.
        for first in range(0, rows, SEED_SLICE):
            count = min(SEED_SLICE, rows - first)
            (silver_rows(spark, first, count, start + span * first / rows,
                         span * count / rows, in_order=True)
             .write.format("delta").mode("append").save(path))
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first().version)


def _timed_batch(spark: SparkSession, settings: Settings, batch: DataFrame,
                 seeded: int) -> float:
    path = silver.TABLE.path(settings)
    started = time.perf_counter()
    silver.process(spark, batch, f"growth-{uuid.uuid4()}", 0, settings=settings)
    seconds = time.perf_counter() - started
    spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {seeded}")
    return seconds


def run(spark: SparkSession, settings: Settings, rows: int, repetitions: int,
        batch_events: int = 20_000) -> dict[str, Any]:
    batch = bronze_batch(spark, settings.replace(root=settings.root.parent / "growth-batch"),
                         batch_events).cache()
    records = batch.count()
    now = datetime.now(UTC) - timedelta(minutes=2)  # the seeded rows end before the batch
    shapes = {
        "empty": (0, now, timedelta(days=1)),
        "last_30_days": (rows, now - timedelta(days=HISTORY_DAYS),
                         timedelta(days=HISTORY_DAYS)),
        "last_24_hours": (rows, now - timedelta(days=1), timedelta(days=1)),
    }
    samples: dict[str, list[float]] = {name: [] for name in shapes}
    # Seeding 10 million rows takes minutes: one seed per shape, the repetitions on it.
    for name, (seed_rows, start, span) in shapes.items():
        seeded = _seed(spark, settings, seed_rows, start, span)
        _timed_batch(spark, settings, batch, seeded)  # warm-up: JIT, snapshot caches
        samples[name] = [_timed_batch(spark, settings, batch, seeded)
                         for _ in range(repetitions)]
    batch.unpersist()
    seconds = {name: {"median": round(statistics.median(values), 2),
                      "min": round(min(values), 2), "max": round(max(values), 2)}
               for name, values in samples.items()}
    empty = seconds["empty"]["median"]
    return {"batch_records": records, "rows_already_in_silver": rows,
            "repetitions": repetitions, "seconds": seconds,
            "ratios": {f"{name}/empty": round(seconds[name]["median"] / empty, 2)
                       for name in ("last_30_days", "last_24_hours")},
            "targets": {"last_30_days/empty": 1.25, "last_24_hours/empty": 1.25}}


def render(results: dict[str, Any]) -> str:
    lines = [f"silver batch of {results['batch_records']:,} records, "
             f"{results['rows_already_in_silver']:,} rows already in silver "
             f"(seconds: median [min-max])"]
    for name, figures in results["seconds"].items():
        lines.append(f"{name:<12}{figures['median']:>8.2f}  [{figures['min']:.2f}-"
                     f"{figures['max']:.2f}]")
    lines.append("ratios: " + ", ".join(f"{name} {value}"
                                        for name, value in results["ratios"].items()))
    return "\n".join(lines)
