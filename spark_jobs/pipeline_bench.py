"""The pipeline against its ceilings, side by side in one run.

The same corpus of messy events (a day of event time) goes, in interleaved repetitions,
through:

- **C0**, the plainest Spark job that lands it: the files read as text, appended to a
  Delta table;
- **C1**, C0 plus ``from_json`` into typed columns: the parse ceiling;
- **the pipeline**: bronze, silver and gold streams with ``--available-now`` on a fresh
  root, each layer's rate taken from its own ``ops.stream_progress`` rows (records read
  over the time its micro-batches took);
- **a reprocess of one day** after it: the busiest event date rebuilt as ``lakehouse
  reprocess --from D --to D`` does, in the day's silver rows per second of the whole
  rebuild, and its silver step alone in bronze records validated again per second (as
  silver's stream rate counts them);
- **the Yahoo Streaming Benchmark's query** (views per campaign per 10-second window): the
  gold ``campaign_stats`` job, its window set to 10 seconds, over the pipeline's silver, in
  events per second and per core.

All use the project's own Spark settings and session, so the ratios bronze/C0 and
silver/C1 say what the pipeline's own work costs on this machine, whatever its speed.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs import streaming
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import Settings
from spark_jobs.dates import DateRange
from spark_jobs.gold import campaign_stats
from spark_jobs.gold import writer as gold_writer
from spark_jobs.ops import stream_progress
from spark_jobs.reprocess import earliest_ingestion, rebuild_silver
from spark_jobs.silver import ad_campaigns
from spark_jobs.silver import ad_events as silver
from spark_jobs.silver.validation import Rules
from spark_jobs.tables import read as read_table

# The typed columns C1 parses into: the contract's fields, as a plain job would read them.
C1_SCHEMA = ("event_id string, event_time string, event_type string, ad_id string, "
             "user_id string, page_id string, ad_type string, ip_address string, price string")
LAYER_QUERIES = {"bronze": ("bronze_ad_events",), "silver": ("silver_ad_events",),
                 "gold": ("gold_campaign_stats", "gold_ad_attribution")}
YSB_WINDOW = "10 seconds"


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def ceiling_c0(spark: SparkSession, landing: Path, target: Path) -> float:
    shutil.rmtree(target, ignore_errors=True)
    return _timed(lambda: spark.read.text(str(landing)).write.format("delta")
                  .mode("append").save(str(target)))


def ceiling_c1(spark: SparkSession, landing: Path, target: Path) -> float:
    shutil.rmtree(target, ignore_errors=True)
    return _timed(lambda: spark.read.text(str(landing))
                  .select(F.from_json("value", C1_SCHEMA).alias("event")).select("event.*")
                  .write.format("delta").mode("append").save(str(target)))


def _link_tree(source: Path, target: Path) -> None:
    """The corpus into a fresh landing zone without copying bytes (hard links)."""
    for path in source.rglob("*"):
        if path.is_file():
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, destination)


def pipeline(spark: SparkSession, settings: Settings, corpus: Path) -> dict[str, Any]:
    """Every layer over the corpus on a fresh root; rates per layer from its progress."""
    shutil.rmtree(settings.root, ignore_errors=True)
    _link_tree(corpus, settings.landing_dir)
    wall = _timed(lambda: streaming.run_available_now(spark, settings, list(LAYER_QUERIES)))
    batches = (read_table(spark, settings, stream_progress.TABLE)
               .select("query_name", "batch_at", "batch_duration_ms", "num_input_rows")
               .collect())
    layers = {}
    for layer, queries in LAYER_QUERIES.items():
        own = [batch for batch in batches if batch.query_name in queries]
        rows = max(sum(b.num_input_rows for b in own if b.query_name == q) for q in queries)
        seconds = _covered_seconds([(b.batch_at.timestamp(),
                                     b.batch_at.timestamp() + b.batch_duration_ms / 1000)
                                    for b in own])
        layers[layer] = {"rows": rows, "seconds": round(seconds, 2),
                         "rows_per_second": round(rows / seconds)}
    return {"wall_seconds": round(wall, 2), "layers": layers}


def _covered_seconds(spans: list[tuple[float, float]]) -> float:
    """How long at least one of the (start, end) spans was under way: a layer's time, when
    its queries' micro-batches (gold's two) run side by side."""
    covered, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reached:
            covered += end - max(start, reached)
            reached = end
    return covered


def reprocess_day(spark: SparkSession, settings: Settings) -> dict[str, Any]:
    """The busiest event date rebuilt in silver and gold. Its silver rows are deleted first,
    so the rebuild writes them all again; gold's day is recomputed, compared and replaced
    where it differs (the windows of events the stream found late)."""
    path = silver.TABLE.path(settings)
    busiest = (spark.read.format("delta").load(path).groupBy("event_date").count()
               .orderBy(F.desc("count")).first())
    days = DateRange(busiest.event_date, busiest.event_date)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE {days.date_predicate('event_date')}")

    rules = Rules.from_settings(settings)
    # What the silver step validates again: every bronze record that could hold the day,
    # counted from the state the rebuild starts from (the day's silver rows deleted).
    validated = (read_table(spark, settings, bronze.TABLE)
                 .where(F.col("ingest_date") >= earliest_ingestion(spark, settings, days, rules))
                 .count())
    silver_seconds = _timed(lambda: rebuild_silver(spark, settings, days, rules,
                                                   dry_run=False))
    gold_seconds = _timed(lambda: gold_writer.rebuild(lambda: spark, settings, days,
                                                      dry_run=False))
    seconds = silver_seconds + gold_seconds
    return {"event_date": str(busiest.event_date), "rows": busiest["count"],
            "seconds": round(seconds, 2), "rows_per_second": round(busiest["count"] / seconds),
            "silver_seconds": round(silver_seconds, 2), "gold_seconds": round(gold_seconds, 2),
            "bronze_records_validated": validated,
            "silver_step_records_per_second": round(validated / silver_seconds)}


def ysb_query(spark: SparkSession, settings: Settings) -> float:
    """Silver's events through the gold ``campaign_stats`` job with YSB's 10-second window,
    on a copy of the pipeline's silver and campaigns; events per second of its batches.
    (The session's table names point at the copy afterwards: run it last.)"""
    ysb = settings.replace(root=settings.root.parent / "ysb", window_duration=YSB_WINDOW)
    shutil.rmtree(ysb.root, ignore_errors=True)
    for table in (silver.TABLE, ad_campaigns.TABLE):
        shutil.copytree(table.path(settings), table.path(ysb))
    query = campaign_stats.start(spark, ysb, {"availableNow": True})
    query.awaitTermination()
    batches = [progress for progress in query.recentProgress if progress["numInputRows"]]
    if not batches:
        raise RuntimeError(f"the YSB query read no event from {silver.TABLE.path(ysb)}")
    return (sum(progress["numInputRows"] for progress in batches)
            / sum(progress["durationMs"]["triggerExecution"] / 1000 for progress in batches))


def run(spark: SparkSession, settings: Settings, corpus: Path, records: int,
        repetitions: int) -> dict[str, Any]:
    """C0, C1 and the pipeline, ``repetitions`` times interleaved; medians and ranges."""
    landing = corpus / "events"
    scratch = settings.root.parent / "ceilings"
    ceiling_c0(spark, landing, scratch / "warm-up")  # JIT and file cache, not measured
    samples: dict[str, list[float]] = {"C0": [], "C1": [], "bronze": [], "silver": [],
                                       "gold": [], "pipeline": [], "reprocess_day": [],
                                       "reprocess_silver_step": [],
                                       "ysb_query": []}
    # Each rebuild as measured: the day's share of the corpus follows the clock (its day of
    # event time ends when it is generated), and the day rate with it.
    rebuilds: list[dict[str, Any]] = []
    for _ in range(repetitions):
        samples["C0"].append(records / ceiling_c0(spark, landing, scratch / "c0"))
        samples["C1"].append(records / ceiling_c1(spark, landing, scratch / "c1"))
        measured = pipeline(spark, settings, corpus)
        for layer, figures in measured["layers"].items():
            samples[layer].append(figures["rows_per_second"])
        samples["pipeline"].append(records / measured["wall_seconds"])
        day = reprocess_day(spark, settings)
        rebuilds.append(day)
        samples["reprocess_day"].append(day["rows_per_second"])
        samples["reprocess_silver_step"].append(day["silver_step_records_per_second"])
        samples["ysb_query"].append(ysb_query(spark, settings))
    rates = {name: {"median": round(statistics.median(values)), "min": round(min(values)),
                    "max": round(max(values))} for name, values in samples.items()}
    return {
        "records": records, "repetitions": repetitions, "rows_per_second": rates,
        "ratios": {"bronze/C0": round(rates["bronze"]["median"] / rates["C0"]["median"], 2),
                   "silver/C1": round(rates["silver"]["median"] / rates["C1"]["median"], 2),
                   "reprocess_day/silver": round(rates["reprocess_day"]["median"]
                                                 / rates["silver"]["median"], 2),
                   "reprocess_silver_step/silver": round(
                       rates["reprocess_silver_step"]["median"] / rates["silver"]["median"],
                       2)},
        "reprocess_days": rebuilds,
        "ysb_query_events_per_second_per_core": round(
            rates["ysb_query"]["median"] / spark.sparkContext.defaultParallelism),
        "targets": {"bronze/C0": 0.8, "silver/C1": 0.5, "reprocess_day/silver": 1.0,
                    "pipeline_rows_per_second": 15_000},
    }


def render(results: dict[str, Any]) -> str:
    lines = [f"{results['records']} records, {results['repetitions']} interleaved repetitions "
             f"(rows/s: median [min-max])",
             f"{'stage':<22}{'median':>10}{'range':>22}"]
    for name, rate in results["rows_per_second"].items():
        lines.append(f"{name:<22}{rate['median']:>10,}{rate['min']:>11,} - {rate['max']:<9,}")
    lines.append("ratios: " + ", ".join(f"{name} {value}"
                                        for name, value in results["ratios"].items()))
    lines.append(f"YSB query: {results['ysb_query_events_per_second_per_core']:,} events/s "
                 f"per core")
    return "\n".join(lines)
