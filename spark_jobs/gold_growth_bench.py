"""Gold's per-batch cost against how long the streams have run.

Issue 13 asks that a gold micro-batch after 10,000 earlier ones take at most 1.25x one
after 100. What earlier batches leave behind, and a gold batch may pay for, is Delta
history: the log of silver (the gold streams' source, read commit by commit) and of the
two gold tables (each batch MERGEs into them: a snapshot to update, file statistics to
skip by, a transaction identifier to look up), and a data file more per batch in each.
The streams' own checkpoints keep 100 batches whatever the uptime, and the attribution
join's state is bounded by its watermark, not by the batch count.

Replaying 10,000 real micro-batches takes hours (a Delta commit alone costs 0.3 s here),
so the history is written directly, as the streams leave it: per earlier batch, one commit
to each table adding one small data file, the files written by Delta itself in one job (so
their statistics are Delta's own), each moved under its table with a commit of its own,
then a checkpoint at the newest version (Delta writes one every ten commits). A
``campaign_stats`` commit also removes the file the one before added, as its MERGE rewrites
the file holding the windows it updates (the log keeps the tombstones); an attribution
commit only adds (a real one adds a file per output partition, up to four here: this is the
lighter case); silver's are marked as not changing data, as an OPTIMIZE is, because gold
counted those events already. Not synthesised: each commit's ``.crc`` file and the earlier
checkpoints, which a real log also lists, and the rows a real ``campaign_stats`` file
accumulates (see bench/HISTORY.md, "Gold's growth with uptime").

On top of each history, gold's two streams run continuously, as under ``make run``; each
round appends a micro-batch of events to silver (views and the clicks they lead to, in the
5 s of event time after the round before, as a steady feed under a 5 s trigger gives) and
times each stream's micro-batch over it from its progress. The first round is a warm-up.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    StringType,
    StructType,
    TimestampType,
)

from spark_jobs import delta_reader, streaming
from spark_jobs.config import Settings
from spark_jobs.gold import ad_attribution, campaign_stats
from spark_jobs.silver import ad_campaigns
from spark_jobs.silver import ad_events as silver
from spark_jobs.tables import TableSpec, ensure_table

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

HISTORIES = (100, 10_000)
WARM_UP_HISTORY = 10
ROUNDS = 8  # the first a warm-up
BATCH_EVENTS = 2_000
ROWS_PER_HISTORY_FILE = 10
HISTORY_SPAN = timedelta(days=30)
ADS, CAMPAIGNS, USERS = 400, 40, 1_000
QUERIES = (campaign_stats.QUERY_NAME, ad_attribution.QUERY_NAME)
ROUND_TIMEOUT_SECONDS = 600
# Each round holds this much event time, after the round before: a steady feed under
# make run's 5 s trigger, so consecutive batches update the same one-minute windows.
TRIGGER_SECONDS = 5
FEED_LEAD = timedelta(minutes=10)  # the feed's event time starts this long before now
DELTA_FILE_NAME = re.compile(
    r"part-(\d+)-[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}[-.]c(\d+)\..*")


def _filler(schema: StructType, moment: Column) -> list[Column]:
    """A column per field of ``schema``: distinct text per row, ``moment`` for every time,
    its date for every date. Enough for a file's statistics and a table's keys."""
    def value(name: str, kind: object) -> Column:
        if isinstance(kind, TimestampType):
            return moment
        if isinstance(kind, DateType):
            return F.to_date(moment)
        if isinstance(kind, StringType):
            return F.concat(F.lit(f"history-{name}-"), F.col("id").cast("string"))
        if isinstance(kind, LongType | DoubleType | DecimalType):
            return F.lit(1).cast(kind)
        if isinstance(kind, BooleanType):
            return F.lit(False)
        raise TypeError(f"no history filler for {name}: {kind}")
    return [value(field.name, field.dataType).alias(field.name) for field in schema.fields]


def _written_order(add: dict[str, Any]) -> tuple[str, int, int]:
    """An added file's place in writing order: its partition's folder, its task, then its
    number among the task's files there (Delta names them ``part-<task>-<uuid>-c<n>``, or
    ``.c<n>`` in a partition's folder)."""
    folder, _, name = add["path"].rpartition("/")
    written = DELTA_FILE_NAME.fullmatch(name)
    if written is None:
        raise ValueError(f"not a file name Delta writes: {add['path']}")
    return folder, int(written[1]), int(written[2])


def grow(spark: SparkSession, settings: Settings, table: TableSpec, commits: int, *,
         data_change: bool, rewrites: bool, now: datetime) -> int:
    """``commits`` commits more in ``table``'s log, each adding one small data file with
    Delta's own statistics, over the ``HISTORY_SPAN`` before ``now``; then a checkpoint.
    ``rewrites``: each commit also removes the file the one before added, as a MERGE that
    updates the rows of its file does. The table's newest version."""
    path = Path(table.path(settings))
    scratch = path.parent / f".{path.name}-history"
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "_delta_log").mkdir(parents=True)
    # The table's own creation (schema, partitioning, statistics columns) in front of
    # the scratch table, so Delta writes the files as it would write the table's.
    shutil.copy(delta_reader.commit_entry(path, 0), scratch / "_delta_log")
    start = int((now - HISTORY_SPAN).timestamp())
    step = HISTORY_SPAN.total_seconds() / commits
    file_number = F.floor(F.col("id") / ROWS_PER_HISTORY_FILE)
    moment = F.timestamp_seconds(F.lit(start) + file_number * F.lit(step))
    # A file per ROWS_PER_HISTORY_FILE rows, in row order within each partition value
    # (rows of one file share a date), two tasks of whole files each: a task per file
    # took 2.3 times as long (54 s against 23 s for 2,000 files), its tasks' start.
    order = [*table.partitioned_by, "history_row"]
    tasks = 2 if commits % 2 == 0 else 1
    (spark.range(0, commits * ROWS_PER_HISTORY_FILE, numPartitions=tasks)
        .select(*_filler(table.schema, moment), F.col("id").alias("history_row"))
        .sortWithinPartitions(*order).drop("history_row")
        .write.format("delta").mode("append")
        .option("maxRecordsPerFile", ROWS_PER_HISTORY_FILE).save(str(scratch)))
    adds = [action["add"] for action in delta_reader.commit_actions(scratch, 1)
            if "add" in action]
    version = delta_reader.latest_version(path)
    previous: dict[str, Any] | None = None
    for number, add in enumerate(sorted(adds, key=_written_order)):
        target = path / add["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        (scratch / add["path"]).rename(target)
        version += 1
        add["dataChange"] = data_change
        stamp = int(time.time() * 1000)
        actions = [{"commitInfo": {
            "timestamp": stamp, "operation": "MERGE" if rewrites else "WRITE",
            "isBlindAppend": not rewrites, "engineInfo": "lakehouse gold growth bench",
            "txnId": str(uuid.uuid4()), "history": number}}, {"add": add}]
        if rewrites and previous is not None:
            actions.append({"remove": {
                "path": previous["path"], "deletionTimestamp": stamp, "dataChange": True,
                "extendedFileMetadata": True, "partitionValues": previous["partitionValues"],
                "size": previous["size"]}})
        previous = add
        with open(delta_reader.commit_entry(path, version), "x", encoding="utf-8") as log:
            log.write("".join(json.dumps(action) + "\n" for action in actions))
    shutil.rmtree(scratch)
    DeltaTable(str(path)).create_checkpoint()
    return version


def feed_rows(spark: SparkSession, first: int, events: int, slot_start: datetime
              ) -> DataFrame:
    """``events`` silver rows in the ``TRIGGER_SECONDS`` of event time from
    ``slot_start``, as a steady feed's micro-batch holds: pairs of a view in the slot's first
    three fifths and the click on the same ad by the same user a second later (so the
    attribution stream has clicks to attribute, and no later batch holds an earlier view
    for them); ids from ``first`` on."""
    pair = F.floor((F.col("id") - first) / 2)
    is_click = F.col("id") % 2 == 1
    micros = (F.lit(int(slot_start.timestamp() * 1_000_000))
              + (pair * (TRIGGER_SECONDS * 600_000) / (events // 2)).cast("long")
              + F.when(is_click, 1_000_000).otherwise(0))
    when = F.timestamp_micros(micros)
    return spark.range(first, first + events).select(
        F.concat(F.lit("feed-"), F.col("id").cast("string")).alias("event_id"),
        when.alias("event_time"), F.to_date(when).alias("event_date"),
        F.when(is_click, "click").otherwise("view").alias("event_type"),
        F.concat(F.lit("u-"), (pair % USERS).cast("string")).alias("user_id"),
        F.lit("p-1").alias("page_id"),
        F.concat(F.lit("ad-"), (pair % ADS).cast("string")).alias("ad_id"),
        F.lit("banner").alias("ad_type"), F.lit("10.0.0.1").alias("ip_address"),
        F.lit(None).cast("decimal(12,2)").alias("price"),
        F.lit(None).cast("string").alias("_rescued"), F.lit(False).alias("event_id_derived"),
        F.concat(F.lit("file:bench:"), F.col("id").cast("string")).alias("bronze_id"),
        F.lit("file").alias("source"), F.current_timestamp().alias("ingested_at"))


def _mapping(spark: SparkSession, now: datetime) -> DataFrame:
    """Each ad in one of ``CAMPAIGNS`` campaigns since long before the history."""
    return spark.range(ADS).select(
        F.concat(F.lit("ad-"), F.col("id").cast("string")).alias("ad_id"),
        F.concat(F.lit("campaign-"), (F.col("id") % CAMPAIGNS).cast("string"))
        .alias("campaign_id"),
        F.lit(now - 2 * HISTORY_SPAN).alias("valid_from"),
        F.lit(None).cast("timestamp").alias("valid_to"),
        F.lit("bench").alias("source_file"), F.lit(now).alias("ingested_at"))


def _append(frame: DataFrame, settings: Settings, table: TableSpec) -> None:
    frame.write.format("delta").mode("append").save(table.path(settings))


def _last_batch_read(query: StreamingQuery) -> int:
    """The id of the query's last micro-batch that read rows, -1 before one. Not the last
    progress's: a stream idle for a while reports progress under the id its next batch
    will have, and that batch would then never count as one after it."""
    return max((progress["batchId"] for progress in query.recentProgress
                if progress["numInputRows"]), default=-1)


def _batch_over(query: StreamingQuery, after: int) -> dict[str, Any] | None:
    """The query's first micro-batch after ``after`` that read rows, if it has run."""
    return next((progress for progress in query.recentProgress
                 if progress["batchId"] > after and progress["numInputRows"]), None)


def _rounds(spark: SparkSession, settings: Settings, rounds: int, events: int,
            feed_start: datetime
            ) -> tuple[dict[str, list[float]], dict[str, list[dict[str, int]]]]:
    """Gold's streams running on; per round, a batch of events into silver (the
    ``TRIGGER_SECONDS`` of event time after the round before, the first one's from
    ``feed_start``) and each stream's micro-batch over it, in seconds."""
    # The two streams measured, not the sessions stream beside them in gold's driver: its
    # one-minute trigger would hold every round a minute.
    queries = streaming.start_streams(spark, settings, QUERIES, {"processingTime": "1 second"})
    seconds: dict[str, list[float]] = {query.name: [] for query in queries}
    stages: dict[str, list[dict[str, int]]] = {query.name: [] for query in queries}
    try:
        for number in range(rounds):
            seen = {query.name: _last_batch_read(query) for query in queries}
            slot = feed_start + timedelta(seconds=number * TRIGGER_SECONDS)
            _append(feed_rows(spark, (number + 1) * 10_000_000, events, slot), settings,
                    silver.TABLE)
            deadline = time.monotonic() + ROUND_TIMEOUT_SECONDS
            batches: dict[str, dict[str, Any]] = {}
            while len(batches) < len(queries):
                for query in queries:
                    if query.exception() is not None:
                        raise RuntimeError(f"{query.name} failed") from None
                    if (batch := _batch_over(query, seen[query.name])) is not None:
                        batches[query.name] = batch
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no gold batch within {ROUND_TIMEOUT_SECONDS} s")
                time.sleep(0.2)
            # The stream may have started its batch before the append landed: wait for it
            # to go idle, so the next round starts from a quiet stream.
            while any(query.status["isTriggerActive"] for query in queries):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gold still busy {ROUND_TIMEOUT_SECONDS} s on")
                time.sleep(0.2)
            for name, batch in batches.items():
                seconds[name].append(batch["durationMs"]["triggerExecution"] / 1000)
                stages[name].append(batch["durationMs"])
    finally:
        for query in queries:
            query.stop()
    return seconds, stages


def _median_stages(batches: list[dict[str, int]]) -> dict[str, float]:
    """Spark's phases of a micro-batch (``durationMs``: the source's offsets, planning,
    the sink's ``addBatch``, the checkpoint's commits), median seconds over ``batches``."""
    return {phase: round(statistics.median(batch.get(phase, 0) for batch in batches) / 1000, 2)
            for phase in sorted({phase for batch in batches for phase in batch})}


def one_history(spark: SparkSession, settings: Settings, commits: int, rounds: int,
                events: int) -> dict[str, Any]:
    """Gold's micro-batches on a lake whose streams ran ``commits`` batches before."""
    shutil.rmtree(settings.root, ignore_errors=True)
    now = datetime.now(UTC)
    for table in (silver.TABLE, ad_campaigns.TABLE):
        ensure_table(spark, settings, table)
    _append(_mapping(spark, now), settings, ad_campaigns.TABLE)
    # Gold's checkpoints first, over a first batch, so that the history is behind them.
    _append(feed_rows(spark, 0, events, now - FEED_LEAD), settings, silver.TABLE)
    streaming.run_available_now(spark, settings, ["gold"])
    # Silver's history comes after gold's checkpoint, marked as no data change (gold counted
    # those events): the streams' first batch reads past its 10,000 commits, in the
    # warm-up round. Each campaign_stats batch rewrites the file holding the windows it
    # updates; an attribution batch mostly inserts clicks (files added).
    grown = ((silver.TABLE, False, False), (campaign_stats.TABLE, True, True),
             (ad_attribution.TABLE, True, False))
    for table, changes, rewrites in grown:
        grow(spark, settings, table, commits, data_change=changes, rewrites=rewrites, now=now)
    measured, stages = _rounds(spark, settings, rounds, events,
                       now - FEED_LEAD + timedelta(seconds=TRIGGER_SECONDS))
    logs = {}
    for table, _, _ in grown:
        log = DeltaTable(table.path(settings))
        logs[table.name] = {"version": log.version(), "files": len(log.file_uris())}
    return {"earlier_batches": commits, "tables_after": logs,
            "warm_up_seconds": {name: values[0] for name, values in measured.items()},
            "seconds": {name: _spread(values[1:]) for name, values in measured.items()},
            "stages_seconds": {name: _median_stages(batches[1:])
                               for name, batches in stages.items()}}


def _spread(values: list[float]) -> dict[str, float]:
    """Median, mean, min and max: the mean carries a checkpoint's cost (Delta writes one
    every tenth commit, of every action: larger on a longer history), which lands in one
    round and the median leaves out."""
    return {"median": round(statistics.median(values), 2),
            "mean": round(statistics.fmean(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2)}


def run(spark: SparkSession, settings: Settings, histories: tuple[int, ...] = HISTORIES,
        rounds: int = ROUNDS, events: int = BATCH_EVENTS) -> dict[str, Any]:
    shorter, longer = min(histories), max(histories)
    # JIT and caches warmed on a lake of its own first; then the longest history first, so
    # what warming remains favours the shorter one, against the ratio the target bounds.
    one_history(spark, settings.replace(root=settings.root / "warm-up"), WARM_UP_HISTORY, 2,
                events)
    measured = {commits: one_history(
                    spark, settings.replace(root=settings.root / f"after-{commits}"),
                    commits, rounds, events)
                for commits in sorted(histories, reverse=True)}

    def ratio(name: str, statistic: str) -> float:
        return round(measured[longer]["seconds"][name][statistic]
                     / measured[shorter]["seconds"][name][statistic], 2)

    def ratios(statistic: str) -> dict[str, float]:
        return {f"{name} after {longer:,}/after {shorter:,}": ratio(name, statistic)
                for name in QUERIES}

    return {"batch_events": events, "rounds": rounds - 1,
            "histories": [measured[commits] for commits in sorted(histories)],
            "ratios": ratios("median"), "ratios_of_means": ratios("mean"),
            "target": 1.25}


def render(results: dict[str, Any]) -> str:
    lines = [f"a gold batch of {results['batch_events']:,} events after earlier batches "
             f"(seconds: median, mean [min-max] of {results['rounds']})"]
    for history in results["histories"]:
        for name, spread in history["seconds"].items():
            lines.append(f"  after {history['earlier_batches']:>6,}  {name:<22}"
                         f"{spread['median']:>7.2f}, {spread['mean']:.2f} "
                         f"[{spread['min']:.2f}-{spread['max']:.2f}]")
    lines.append("  Spark's phases of a batch (median seconds, over 0.05 s):")
    for history in results["histories"]:
        for name, phases in history["stages_seconds"].items():
            shown = ", ".join(f"{phase} {seconds:.2f}" for phase, seconds in phases.items()
                              if seconds > 0.05 and phase != "triggerExecution")
            lines.append(f"  after {history['earlier_batches']:>6,}  {name:<22}{shown}")
    for name, value in results["ratios"].items():
        lines.append(f"  {name}: {value} (target {results['target']}), "
                     f"of means {results['ratios_of_means'][name]}")
    return "\n".join(lines)
