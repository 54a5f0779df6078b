"""``bronze.ad_events``: one row per record received, raw text untouched.

Grain: one row per non-blank line delivered to the landing zone (or Kafka message), exactly
once per delivery. ``bronze_id`` names the delivery (file and line, or topic, partition and
offset), so every later layer can say which delivery each of its rows came from.
"""

from __future__ import annotations

import logging
import re
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import (
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs import checkpoints, storage
from spark_jobs.config import ConfigError, Settings
from spark_jobs.delta_writes import append_once, session_setting, start_exactly_once
from spark_jobs.landing import clean_read_files, whole_files
from spark_jobs.storage import lake_path
from spark_jobs.tables import TableSpec, ensure_table

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)


SCHEMA = StructType([
    StructField("bronze_id", StringType(), False),
    StructField("raw", StringType(), False),
    StructField("source", StringType(), False),  # "file" or "kafka"
    StructField("source_file", StringType()),
    StructField("source_line", LongType()),
    StructField("kafka_topic", StringType()),
    StructField("kafka_partition", IntegerType()),
    StructField("kafka_offset", LongType()),
    StructField("ingested_at", TimestampType(), False),
    StructField("ingest_date", DateType(), False),
])

TABLE = TableSpec.declared("bronze.ad_events", SCHEMA)
QUERY_NAME = str(TABLE.stream)  # the stream this module starts

# How many tasks per core a large read of bronze is split into (``even_reads``).
READ_SPLITS_PER_CORE = 4


@contextmanager
def even_reads(spark: SparkSession) -> Iterator[None]:
    """Reads planned inside (a stream started inside: all of its reads) are split into
    ``READ_SPLITS_PER_CORE`` tasks per core (Spark's ``minPartitionNum``), at row groups'
    bounds (``registry``: bronze's are 32 MB); bronze's is the read it is for. The cores are
    counted when it is entered: a stream started before a cluster's workers joined keeps
    the smaller count until it starts again.

    Spark's own split is an even share of the read per core (at most 128 MB), and packs
    whole files into it: the bench's million records, five bronze files of 24-61 MB,
    became three tasks of 280,000 to 380,000 records on two cores, the third validated
    alone while a core waited (its stage 10.1 s against 8.3 s split in six to nine; the
    whole silver batch 18.1 s against 18.9 s, median of four alternated, bench/HISTORY.md,
    7 December). A small read stays one task or a few: no split is smaller than Spark's
    cost of opening a file (4 MB)."""
    splits = READ_SPLITS_PER_CORE * spark.sparkContext.defaultParallelism
    with session_setting(spark, "spark.sql.files.minPartitionNum", str(splits)):
        yield


# The observed metric holding a micro-batch's record count (``ops.stream_progress``).
RECORDS_METRIC = "records"

# Files in the landing zone; Spark's file source already skips the hidden names that
# writers use before their atomic rename.
LANDING_GLOB = "*.{jsonl,jsonl.gz}"

BOM = "\ufeff"
BLANKS = " \t\n\u000b\f\r"  # what a regular expression's \s matches: a blank line


def _unmarked(text: Column) -> Column:
    """``text`` without a leading byte-order mark, which belongs to the encoding."""
    return F.when(text.startswith(BOM), F.substring(text, 2, 1 << 30)).otherwise(text)


def lines_from_files(files: DataFrame) -> DataFrame:
    """Whole files (``value``, ``file_path``) to one bronze row per non-blank line.

    Reading each file whole is what gives every line a stable position, so a delivery has
    the same identity however often the file is read. A leading byte-order mark and a
    trailing carriage return belong to the file's encoding, not to the record: both go.
    """
    # This runs on every record: the identity's prefix is built once per file, and lines
    # are cleaned with plain string tests, not regular expressions (1.6x faster than
    # before, profiled on 300,000 records). A byte-order mark can open any line (files
    # concatenated, a producer marking each record), so each line loses its own.
    line, unmarked, raw = F.col("line"), F.col("unmarked"), F.col("raw")
    lines = files.select(
        F.concat(F.lit("file:"), "file_path", F.lit(":")).alias("id_prefix"),
        "file_path",
        F.posexplode(F.split("value", "\n")).alias("line_index", "line"),
    ).select(
        "id_prefix", "file_path",
        (F.col("line_index") + 1).cast("long").alias("source_line"),
        _unmarked(line).alias("unmarked"),
    ).select(
        "id_prefix", "file_path", "source_line",
        F.when(unmarked.endswith("\r"), F.expr("substr(unmarked, 1, length(unmarked) - 1)"))
        .otherwise(unmarked).alias("raw"),
    )
    # A record starts with "{"; only the others need the (copying) trim to tell blank.
    non_blank = F.when(raw.startswith("{"), F.lit(True)).otherwise(
        F.btrim(raw, F.lit(BLANKS)) != "")
    ingested_at = F.current_timestamp()
    return lines.where(non_blank).select(
        F.concat("id_prefix", F.col("source_line").cast("string")).alias("bronze_id"),
        "raw",
        F.lit("file").alias("source"),
        F.col("file_path").alias("source_file"),
        "source_line",
        F.lit(None).cast("string").alias("kafka_topic"),
        F.lit(None).cast("int").alias("kafka_partition"),
        F.lit(None).cast("long").alias("kafka_offset"),
        ingested_at.alias("ingested_at"),
        F.to_date(ingested_at).alias("ingest_date"),
    )


def records_from_kafka(messages: DataFrame, topic_id: str) -> DataFrame:
    """Kafka messages (the Kafka source's columns) of the topic made as ``topic_id`` to one
    bronze row per message.

    A message is a record whatever it holds: an empty or null value is kept (silver
    quarantines it as not JSON), since a topic has no blank lines to skip. Bytes that are not
    UTF-8 become U+FFFD, as the landing zone's text reader makes them, so silver quarantines
    the record as ``invalid_encoding``. Topic (the one made as ``topic_id``: a topic made
    again under its name starts its offsets at 0 again), partition and offset are the
    delivery's identity: a message read again after a restart is the same bronze row.
    """
    text = F.coalesce(F.expr("make_valid_utf8(cast(value AS STRING))"), F.lit(""))
    ingested_at = F.current_timestamp()
    return messages.select(
        F.concat(F.lit("kafka:"), "topic", F.lit(f"@{topic_id}:"),
                 F.col("partition").cast("string"), F.lit(":"),
                 F.col("offset").cast("string")).alias("bronze_id"),
        _unmarked(text).alias("raw"),
        F.lit("kafka").alias("source"),
        F.lit(None).cast("string").alias("source_file"),
        F.lit(None).cast("long").alias("source_line"),
        F.col("topic").alias("kafka_topic"),
        F.col("partition").cast("int").alias("kafka_partition"),
        F.col("offset").cast("long").alias("kafka_offset"),
        ingested_at.alias("ingested_at"),
        F.to_date(ingested_at).alias("ingest_date"),
    )


def kafka_messages(spark: SparkSession, settings: Settings) -> DataFrame:
    """The topic as a stream, from its first message on a stream's first start.

    ``failOnDataLoss`` is on unless the setting turns it off: messages that aged out of
    retention (or were deleted) before bronze read them stop the stream, naming the lost
    offsets (:func:`explain_failure`), instead of being skipped without a word.
    """
    return (spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", settings.kafka_bootstrap_servers)
            .option("subscribe", settings.kafka_topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", settings.kafka_max_offsets_per_trigger)
            .option("failOnDataLoss", str(settings.kafka_fail_on_data_loss).lower())
            .load())


# Per topic name, the id of the topic whose offsets bronze's checkpoint holds.
KAFKA_TOPICS_RECORD = "lakehouse-kafka-topics.json"


def followed_topic(settings: Settings) -> str:
    """The id of the topic bronze is to read, checked against the one whose offsets its
    checkpoint holds (recorded there on the first start; a checkpoint from before this
    record adopts the topic as it is then).

    A topic deleted and made again under its name starts its offsets at 0 again. Resumed on
    the old topic's offsets, the stream would skip the new topic's first messages without a
    word, or, with the data-loss check off, give them the identities of the old topic's
    messages. So such a start stops and says why, unless the loss is accepted
    (``kafka_fail_on_data_loss`` off): then bronze's checkpoint starts over on the new topic,
    from its first message. The id is part of each message's identity in bronze.
    """
    checkpoint = lake_path(settings.checkpoint(QUERY_NAME))
    for leftover in checkpoint.parent.glob(f"{checkpoint.name}.replaced-*"):
        # Set aside by a start over that was killed before removing it (on the object
        # store, the marker of a removal of the checkpoint itself that was cut short).
        if storage.is_object_store(checkpoint):
            storage.remove_tree(checkpoint)
        storage.remove_tree(leftover)
    current = _topic_id(settings)
    followed = checkpoints.read_record(checkpoint, KAFKA_TOPICS_RECORD)
    before = followed.get(settings.kafka_topic)
    if before is not None and before != current:
        if settings.kafka_fail_on_data_loss:
            raise ConfigError(_made_again(settings, before, current))
        log.warning("topic %s was made again (topic id %s, now %s) and the loss is "
                    "accepted: bronze's checkpoint starts over on it, from its first message",
                    settings.kafka_topic, before, current)
        # Offsets, commits and the query id go (the new query's writes carry a new id), in
        # one rename: killed midway, a start finds the whole old checkpoint or none. The
        # object store renames no folder: there a marker says the checkpoint is being
        # removed, and a start that finds it removes the rest.
        aside = checkpoint.with_name(f"{checkpoint.name}.replaced-{time.time_ns()}")
        if storage.is_object_store(checkpoint):
            aside.write_text("", "utf-8")
            storage.remove_tree(checkpoint)
            aside.unlink()
        else:
            storage.replace(checkpoint, aside)
            storage.remove_tree(aside)
        followed = {}
    if followed.get(settings.kafka_topic) != current:
        checkpoints.write_record(checkpoint, KAFKA_TOPICS_RECORD,
                                 {**followed, settings.kafka_topic: current})
    return current


def check_topic_unchanged(settings: Settings) -> None:
    """While the stream runs: the topic it reads was not made again since it started (Spark
    cannot tell once the new topic has grown past the old offsets). A broker that does not
    answer for now (restarting), or a topic gone for now, is Spark's to wait for or fail on,
    not a reason to stop here."""
    from spark_jobs import kafka_topic
    from spark_jobs.services import ServiceError

    followed = checkpoints.read_record(lake_path(settings.checkpoint(QUERY_NAME)),
                                       KAFKA_TOPICS_RECORD).get(settings.kafka_topic)
    try:
        current = kafka_topic.topic_id(settings)
    except ServiceError:
        return
    if current is not None and current != followed:
        raise ConfigError(_made_again(settings, followed, current))


def _topic_id(settings: Settings) -> str:
    from spark_jobs import kafka_topic

    # The topic's partitions first: their answer names a broker that does not answer.
    current = kafka_topic.topic_id(settings) if kafka_topic.partitions(settings) else None
    if current is None:
        # Spark would wait on a missing topic for ever, reading nothing.
        raise ConfigError(f"topic {settings.kafka_topic} does not exist at "
                          f"{settings.kafka_bootstrap_servers}: create it with 'lakehouse "
                          f"services start kafka' or 'lakehouse generate --to kafka'")
    return current


def _made_again(settings: Settings, before: str, current: str) -> str:
    return (f"topic {settings.kafka_topic} was deleted and made again since bronze last read "
            f"it (topic id {before}, now {current}): its offsets start again at 0, and "
            f"whatever the old topic held that bronze had not read is gone. Nothing of the "
            f"new topic was skipped. To go on with it from its first message, accept that "
            f"loss: run the stream once with LAKEHOUSE_KAFKA_FAIL_ON_DATA_LOSS=false, then "
            f"without it (README: Kafka, a topic made again)")


# Spark's words for the offsets it could not read: when a batch it planned meets a gap
# ("Could not read records in offset [1550, 1823) for topic partition ad-events-0"), and when
# it plans one ("Starting offset for ad-events-0 was 1550 but it is 1823 now"). Each gives
# the partition and the lost range, its end excluded.
_LOST_IN_BATCH = re.compile(
    r"offset \[(?P<start>\d+), (?P<end>\d+)\) for topic partition (?P<partition>\S+)")
_LOST_AT_START = re.compile(
    r"[Ss]tarting offset for (?P<partition>\S+) was (?P<start>\d+) but it is (?P<end>\d+) now")


def explain_failure(text: str) -> str | None:
    """For a stream failure of Kafka's data-loss check: which offsets are lost and how to go
    on. None for any other failure."""
    if "KAFKA_DATA_LOSS" not in text and "data may have been lost" not in text.lower():
        return None
    lost = [f"{match['partition']} offsets {match['start']} to {int(match['end']) - 1}"
            for pattern in (_LOST_IN_BATCH, _LOST_AT_START) for match in pattern.finditer(text)]
    where = "; ".join(dict.fromkeys(lost)) or "offsets the stream had not read yet"
    return (f"Kafka no longer holds messages bronze had not read ({where}): they aged out "
            f"of the topic's retention or were deleted while the stream was down. Nothing "
            f"was skipped. To recover, send those records again if their producer can, or "
            f"accept the loss: run the stream once with LAKEHOUSE_KAFKA_FAIL_ON_DATA_LOSS="
            f"false (it goes on from the oldest message the topic still holds), then "
            f"without it (README: Kafka, lost offsets)")


def append(spark: SparkSession, records: DataFrame, app_id: str, batch_id: int, *,
           settings: Settings) -> None:
    """A micro-batch of deliveries into bronze, once (``delta_writes.append_once``; the
    rows' ``ingested_at`` is the batch's own time)."""
    append_once(records, TABLE.path(settings), settings.checkpoint(QUERY_NAME), batch_id,
                app_id=app_id, stamp_column="ingested_at", key_column="bronze_id")


def start(spark: SparkSession, settings: Settings, trigger: dict[str, object]
          ) -> StreamingQuery:
    """The landing zone or the Kafka topic to bronze. The source's checkpoint (files read,
    or offsets) and :func:`append` make each delivery land exactly once, whenever the
    driver dies. (Not Delta's streaming sink: it checks the query's last write against the
    table's whole state before every batch, rebuilt for each new version: 0.2 s against
    0.9 s an append to a table of 3,000 files.)"""
    if settings.source == "kafka":
        topic_id = followed_topic(settings)  # the topic checked before anything is read
        records = records_from_kafka(kafka_messages(spark, settings), topic_id)
    else:
        clean_read_files(settings.landing_events, lake_path(settings.checkpoint(QUERY_NAME)),
                         settings.landing_cleanup, settings.landing_archive)
        # The source counts files (each is read whole); records are counted on the way.
        records = lines_from_files(whole_files(
            spark, settings.landing_events, LANDING_GLOB, settings.max_files_per_trigger,
            cleanup=settings.landing_cleanup, archive=settings.landing_archive))
    records = records.observe(RECORDS_METRIC, F.count(F.lit(1)).alias("rows"))
    ensure_table(spark, settings, TABLE)  # once the source is there
    return start_exactly_once(records, settings, QUERY_NAME, append, trigger)
