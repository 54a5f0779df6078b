"""``make bench``: the pipeline against its ceilings, and what maintenance buys.

By default the parts issue 13 asks of every run (``DEFAULT_PARTS``); ``--parts all`` adds
the comparison with a declarative pipeline and the single-lever parts (landing, maintenance,
start-up).

The pipeline part is ``spark_jobs.pipeline_bench``; the declarative part (the lakehouse
against a plain pipeline written with Spark's declarative pipelines) is
``spark_jobs.declarative_bench``; the feed part (sustained rate and latency behind a live
feed) is ``spark_jobs.feed_bench``; the growth parts (a silver batch beside 10 million
rows, a gold batch after 10,000 earlier ones) are ``spark_jobs.growth_bench`` and
``spark_jobs.gold_growth_bench``; the landing part (a bronze trigger beside the files the
landing zone keeps, archived or not) is ``spark_jobs.landing_bench``. The maintenance part
writes silver and gold as a stream with many short triggers would (one small append per
micro-batch), times two selective queries (one ``ad_id`` over a week of silver, one campaign
over one day of gold), runs ``lakehouse maintain``'s OPTIMIZE, and times them again. A
third copy is written with Delta's auto compaction on, to measure small files avoided at
the source. Results go to ``bench/results/bench-<time>.json`` (with the machine and
versions) and a short table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import (
    alert_bench,
    config,
    declarative_bench,
    feed_bench,
    gold_growth_bench,
    growth_bench,
    landing_bench,
    landing_feed,
    pipeline_bench,
    progress,
    startup_bench,
)
from spark_jobs.config import Settings
from spark_jobs.expected_counts import ExpectedCounts
from spark_jobs.gold import campaign_stats
from spark_jobs.maintenance import optimize
from spark_jobs.session import spark_session
from spark_jobs.silver import ad_events as silver
from spark_jobs.tables import ensure_table

MICRO_BATCHES = 150
EVENTS_PER_BATCH = 2_000
CAMPAIGNS, DAYS = 40, 7
REPEATS = 5
FEED_START_SHARE, FEED_START_RATE = 0.6, 6_000
PARTS = ("pipeline", "declarative", "feed", "growth", "gold_growth", "alerts", "landing",
         "maintenance", "startup")
# What issues 13 and 19 ask of every run (ceilings, layers, reprocessing and YSB; sustained
# rate and latency; silver's and gold's growth; the alert path's latency); the comparisons and
# single-lever measurements are asked for by name, or all at once with ``--parts all``.
DEFAULT_PARTS = ("pipeline", "feed", "growth", "gold_growth", "alerts")


def silver_batch(spark: SparkSession, batch: int) -> DataFrame:
    """One micro-batch of silver rows spread over a week, as late and early events are."""
    return growth_bench.silver_rows(spark, batch * EVENTS_PER_BATCH, EVENTS_PER_BATCH,
                                    datetime.fromtimestamp(1_795_000_000, UTC),
                                    timedelta(days=DAYS))


def gold_batch(events: DataFrame) -> DataFrame:
    """A micro-batch's window rows, campaigns by ad."""
    with_campaign = events.withColumn(
        "campaign_id", F.concat(F.lit("c-"), (F.expr("hash(ad_id)") % CAMPAIGNS).cast("string")))
    return (with_campaign.groupBy("campaign_id", F.window("event_time", "1 minute"))
            .agg(F.count_if(F.col("event_type") == "view").alias("views"),
                 F.count_if(F.col("event_type") == "click").alias("clicks"),
                 F.count_if(F.col("event_type") == "purchase").alias("purchases"),
                 F.coalesce(F.sum("price"), F.lit(0)).cast("decimal(18,2)").alias("revenue"))
            .select("campaign_id", F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"), *campaign_stats.COUNTS))


def best_seconds(query: Callable[[], object]) -> float:
    query()  # warm-up: JIT, snapshot caching
    timings = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        query()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def run(spark: SparkSession, root: Path) -> dict[str, object]:
    shutil.rmtree(root, ignore_errors=True)
    settings = config.load({"root": root})
    silver_path, gold_path = silver.TABLE.path(settings), campaign_stats.TABLE.path(settings)
    auto_path = str(root / "tables" / "bench" / "silver_auto_compacted")
    ensure_table(spark, settings, silver.TABLE)
    ensure_table(spark, settings, campaign_stats.TABLE)

    started = time.perf_counter()
    for batch in range(MICRO_BATCHES):
        events = silver_batch(spark, batch).persist()
        events.write.format("delta").mode("append").save(silver_path)
        gold_batch(events).write.format("delta").mode("append").save(gold_path)
        spark.conf.set("spark.databricks.delta.autoCompact.enabled", "true")
        events.write.format("delta").mode("append").partitionBy("event_date").save(auto_path)
        spark.conf.unset("spark.databricks.delta.autoCompact.enabled")
        events.unpersist()
    write_seconds = time.perf_counter() - started

    week = silver_batch(spark, 0).agg(F.min("event_date"), F.max("event_date")).first()
    one_day = str(week[0])
    queries = {
        "silver: one ad_id over a week": lambda: spark.read.format("delta").load(silver_path)
        .where((F.col("ad_id") == "ad-17")
               & F.col("event_date").between(F.lit(week[0]), F.lit(week[1]))).count(),
        "gold: one campaign over one day": lambda: spark.read.format("delta").load(gold_path)
        .where((F.col("campaign_id") == "c-7")
               & (F.to_date("window_start") == F.lit(one_day))).agg(F.sum("views")).first(),
    }
    before = {name: best_seconds(query) for name, query in queries.items()}
    outcomes = [optimize(spark, settings, name, dry_run=False)
                for name in (silver.TABLE.name, campaign_stats.TABLE.name)]
    after = {name: best_seconds(query) for name, query in queries.items()}
    auto_files = int(spark.sql(f"DESCRIBE DETAIL delta.`{auto_path}`").first().numFiles)

    return {
        "micro_batches": MICRO_BATCHES, "events": MICRO_BATCHES * EVENTS_PER_BATCH,
        "write_seconds": round(write_seconds, 1),
        "tables": {o.table: {"files_before": o.files_before, "files_after": o.files_after,
                             "file_ratio": round(o.files_before / max(o.files_after, 1), 1),
                             "optimize_seconds": round(o.duration_seconds, 1),
                             "detail": o.detail} for o in outcomes},
        "queries": {name: {"seconds_before": round(before[name], 4),
                           "seconds_after": round(after[name], 4),
                           "speedup": round(before[name] / after[name], 2)}
                    for name in queries},
        "auto_compaction_at_source": {
            "files_without": outcomes[0].files_before, "files_with": auto_files},
        "targets": {"file_ratio": 10, "query_speedup": 5},
    }


def render(results: dict) -> str:
    lines = [f"{results['events']} events in {results['micro_batches']} micro-batches",
             f"{'table':<22}{'files before':>14}{'after':>8}{'ratio':>8}"]
    for name, table in results["tables"].items():
        lines.append(f"{name:<22}{table['files_before']:>14}{table['files_after']:>8}"
                     f"{table['file_ratio']:>7}x")
    lines.append(f"{'query':<34}{'before s':>10}{'after s':>10}{'speedup':>9}")
    for name, query in results["queries"].items():
        lines.append(f"{name:<34}{query['seconds_before']:>10.3f}"
                     f"{query['seconds_after']:>10.3f}{query['speedup']:>8}x")
    auto = results["auto_compaction_at_source"]
    lines.append(f"silver files written without / with auto compaction: "
                 f"{auto['files_without']} / {auto['files_with']}")
    return "\n".join(lines)


def corpus(generated: Settings, events: int) -> int:
    """A day of messy events (the generator's default mess) generated into the fresh root
    of ``generated``; the records delivered."""
    shutil.rmtree(generated.root, ignore_errors=True)
    counts = landing_feed.generate(generated.root, "--events", str(events), "--seed", "7",
                                   "--events-per-file", "20000", "--span", "1 day")
    return int(counts["delivered"])


def _feed_start_rate(results: dict[str, object]) -> int:
    """A continuous feed pays each micro-batch's fixed cost many times over: start below
    the rate at which the pipeline caught up with a backlog in one batch per layer."""
    pipeline = results.get("pipeline")
    if not isinstance(pipeline, dict):
        return FEED_START_RATE
    backlog_rate = pipeline["rows_per_second"]["pipeline"]["median"]
    return max(int(round(backlog_rate * FEED_START_SHARE, -3)), 1_000)


@contextmanager
def _part(results: dict[str, object], steps: progress.Steps, name: str, description: str
          ) -> Iterator[None]:
    """One part of the run, its wall time kept in ``results["part_seconds"]`` (a failed part's
    too): issue 13 asks for the whole of ``make bench`` within 30 minutes."""
    steps.start(description)
    started = time.monotonic()
    try:
        yield
    finally:
        seconds = results.setdefault("part_seconds", {})
        seconds[name] = round(time.monotonic() - started, 1)  # type: ignore[index]


def render_durations(part_seconds: dict[str, float]) -> str:
    """How long the run and each of its parts took, in minutes."""
    parts = ", ".join(f"{name} {seconds / 60:.1f}" for name, seconds in part_seconds.items())
    return f"minutes: {sum(part_seconds.values()) / 60:.1f} in all ({parts})"


def machine() -> dict[str, object]:
    import pyspark

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cores": os.cpu_count(), "memory_gib": round(memory / 2**30, 1),
            "python": platform.python_version(), "pyspark": pyspark.__version__,
            "delta_spark": metadata.version("delta-spark"), "platform": platform.platform()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"),
                        help="scratch folder (wiped)")
    parser.add_argument("--results", type=Path, default=Path("bench/results"),
                        help="where the JSON results go")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--growth-rows", type=int, default=10_000_000,
                        help="rows already in silver for the growth measurement")
    parser.add_argument("--landing-files", type=int, default=50_000,
                        help="files already ingested in the landing zone, for the landing part")
    parser.add_argument("--feed-rate", type=int,
                        help="events a second of the first sustained trial (default: "
                        f"{FEED_START_SHARE:.0%}% of the pipeline's backlog rate, measured "
                        f"first, or {FEED_START_RATE:,})")
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                        help=f"comma-separated, among {', '.join(PARTS)}; or all "
                        f"(default: {','.join(DEFAULT_PARTS)})")
    args = parser.parse_args()
    parts = list(PARTS) if args.parts == "all" else args.parts.split(",")
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; known: {', '.join(PARTS)}")
    root = args.root.resolve()
    # One batch per layer, as a backlog is caught up; the project's settings otherwise.
    settings = config.load({"root": root / "lake", "max_files_per_trigger": 100_000})
    # The messy corpus the pipeline and declarative parts share: a generated landing zone.
    generated = settings.replace(root=root / "corpus")
    results: dict[str, object] = {
        "machine": machine(), "at": datetime.now(UTC).isoformat(timespec="seconds")}
    try:
        with (spark_session(settings, "lakehouse-bench") as spark,
              progress.steps(progress.wanted()) as steps):
            if "pipeline" in parts:
                with _part(results, steps, "pipeline",
                           f"pipeline: {args.events:,} events, {args.repetitions} repetitions"):
                    records = corpus(generated, args.events)
                    results["pipeline"] = pipeline_bench.run(
                        spark, settings, generated.landing_dir, records, args.repetitions)
            if "declarative" in parts:
                with _part(results, steps, "declarative",
                           f"declarative: the lakehouse against a plain declarative pipeline, "
                           f"{args.repetitions} repetitions"):
                    made = ExpectedCounts.load(generated.expected_counts_file)
                    if made.delivered != args.events:  # none yet, or another size
                        corpus(generated, args.events)
                    results["declarative"] = declarative_bench.run(
                        settings, generated.landing_dir, root / "declarative", args.repetitions)
            if "feed" in parts:
                with _part(results, steps, "feed", "feed: sustained rate and latency"):
                    # The project's own settings (trigger, files per trigger), as make run has.
                    results["feed"] = feed_bench.run(
                        spark, config.load({"root": root / "feed"}), root / "feed-pool",
                        args.feed_rate or _feed_start_rate(results))
            if "growth" in parts:
                with _part(results, steps, "growth",
                           f"growth: a silver batch beside {args.growth_rows:,} rows"):
                    results["growth"] = growth_bench.run(
                        spark, config.load({"root": root / "growth"}), args.growth_rows,
                        args.repetitions)
            if "gold_growth" in parts:
                with _part(results, steps, "gold_growth",
                           "gold growth: a gold batch after 100 and after 10,000 earlier ones"):
                    results["gold_growth"] = gold_growth_bench.run(
                        spark, config.load({"root": root / "gold-growth"}))
            if "alerts" in parts:
                with _part(results, steps, "alerts",
                           "alerts: click-fraud alert latency through a real Kafka broker"):
                    results["alerts"] = alert_bench.run(
                        spark, config.load({"root": root / "alerts"}))
            if "landing" in parts:
                with _part(results, steps, "landing",
                           f"landing: a bronze trigger after {args.landing_files:,} files"):
                    results["landing"] = landing_bench.run(
                        spark, config.load({"root": root / "landing"}), args.landing_files)
            if "maintenance" in parts:
                with _part(results, steps, "maintenance",
                           "maintenance: queries before and after OPTIMIZE"):
                    results["maintenance"] = run(spark, root / "maintenance")
            if "startup" in parts:
                with _part(results, steps, "startup",
                           "startup: cold commands with and without the class archive"):
                    results["startup"] = startup_bench.run(settings, root / "startup",
                                                           args.repetitions)
    except BaseException as error:  # the parts that finished are kept, with the failure
        results["failed"] = f"{type(error).__name__}: {error}"
        raise
    finally:
        args.results.mkdir(parents=True, exist_ok=True)
        output = args.results / f"bench-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
        output.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    for part, show in (("pipeline", pipeline_bench.render),
                       ("declarative", declarative_bench.render), ("feed", feed_bench.render),
                       ("growth", growth_bench.render),
                       ("gold_growth", gold_growth_bench.render),
                       ("alerts", alert_bench.render),
                       ("landing", landing_bench.render),
                       ("maintenance", render), ("startup", startup_bench.render)):
        if part in results:
            print(show(results[part]))
    print(render_durations(results["part_seconds"]))  # type: ignore[arg-type]
    print(f"results: {output}")


if __name__ == "__main__":
    main()
