"""``ops.alerts``: click-fraud alerts, raised within seconds of the clicks, not after the
tables' micro-batches.

Grain: one row per alert: an ``ip_address`` that made more than
``alert_clicks_per_minute`` distinct valid clicks in one minute of event time. An alert is
raised once, when its minute first goes over the limit; its ``alert_id`` is a hash of the
address and the minute, so whoever raises it again (a replayed batch, the batch function
over silver) raises the same alert.

The stream reads what bronze reads when that is Kafka (the topic, with offsets of its own,
so it does not wait for bronze's trigger); from the file landing zone it reads bronze's new
rows, because bronze archives the files it has read and a second reader of the folder would
miss them. Each record goes through silver's own ``validate``, so a click counts here
exactly when silver will keep it; deliveries of one ``event_id`` count once (Spark's
deduplication within ``alert_watermark_delay``), and each minute's count is Spark's
windowed aggregation in its RocksDB state, emitted whenever it grows (update mode), with a
processing-time trigger of its own where it reads Kafka (``alert_trigger``; reading bronze,
``table_poll_interval``).

Delivery: at least once. A micro-batch publishes its new alerts to the Kafka topic
``alert_topic`` (when the source is Kafka) and then appends them to ``ops.alerts`` once
(``delta_writes.append_once``: the commit names the batch, so a replay finds it). A driver
killed between the two replays the batch: the same alerts, with the same ids and batch
time, are published again, and recorded once. An alert already in ``ops.alerts`` is not
published again, however much its minute grows later.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs import kafka_topic
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import Settings, interval_seconds, spark_interval
from spark_jobs.delta_writes import append_once, planned_time, start_exactly_once
from spark_jobs.faults import crash_point
from spark_jobs.silver.validation import Rules, validate
from spark_jobs.tables import TableSpec, ensure_table
from spark_jobs.tables import read as read_table

if TYPE_CHECKING:
    from confluent_kafka import Producer
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

# Read from the landing zone's bronze: VACUUM of bronze keeps what the stream has yet to read.
SOURCE_TABLE = bronze.TABLE
# The stream's state (offsets of its source, the minutes counted so far) means something
# only for the source it was built on and the lateness it was built with.
STATE_SETTINGS = ("source", "alert_watermark_delay")

WINDOW = "1 minute"

SCHEMA = StructType([
    StructField("alert_id", StringType(), False),  # sha-256 of the address and the minute
    StructField("ip_address", StringType(), False),
    StructField("window_start", TimestampType(), False),
    StructField("window_end", TimestampType(), False),
    StructField("clicks", LongType(), False),  # distinct clicks counted when it was raised
    StructField("threshold", IntegerType(), False),  # alert_clicks_per_minute then
    StructField("raised_at", TimestampType(), False),  # when its micro-batch was planned
])

TABLE = TableSpec.declared("ops.alerts", SCHEMA)
QUERY_NAME = str(TABLE.stream)


def maybe_clicks(records: DataFrame) -> DataFrame:
    """The bronze records that can be clicks, before validation (the costly part): those
    holding the word in any case, or a JSON escape that could spell it. Exact: validation
    lower-cases ``event_type``'s text with the same function, and the text is in the record
    either as it is or escaped. Most records are views, so this spares validating most of
    them twice (here and in silver)."""
    raw = F.col("raw")
    return records.where(F.lower(raw).contains("click") | raw.contains("\\u"))


def valid_clicks(validated: DataFrame, settings: Settings) -> DataFrame:
    """The valid clicks of validated bronze records (``validation.validate``) that name an
    address: ``event_id``, ``event_time``, ``ip_address``.

    Not a click stamped more than ``alert_watermark_delay`` after its delivery's ingestion
    (clock skew, which validation lets through up to ``future_tolerance``): the alert
    stream's watermark follows the latest click, and one click a day ahead would make every
    other click late, and silence the alerts for a day."""
    ahead = F.make_interval(secs=F.lit(interval_seconds(settings.alert_watermark_delay)))
    return (validated
            .where(F.col("reason").isNull() & (F.col("event_type") == "click")
                   & (F.trim("ip_address") != "")
                   & (F.col("event_time") <= F.col("ingested_at") + ahead))
            .select("event_id", "event_time", "ip_address"))


def click_fraud(clicks: DataFrame, threshold: int) -> DataFrame:
    """Per ``ip_address`` and minute of event time with more than ``threshold`` of
    ``clicks`` (distinct events), the alert, without its ``raised_at``.

    The one transform of both runners: the stream applies it to its deduplicated clicks,
    the batch recomputation to silver's (distinct already)."""
    window = F.window("event_time", WINDOW)
    minute = (clicks.groupBy("ip_address", window.alias("window"))
              .agg(F.count(F.lit(1)).alias("clicks")))
    # Epoch seconds, not the timestamp's text, which would follow the session's time zone.
    identity = F.concat_ws("|", F.col("ip_address"),
                           F.unix_seconds(F.col("window.start")).cast("string"))
    return minute.where(F.col("clicks") > threshold).select(
        F.sha2(identity, 256).alias("alert_id"),
        "ip_address",
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "clicks",
        F.lit(threshold).cast("int").alias("threshold"))


def from_silver(events: DataFrame, settings: Settings) -> DataFrame:
    """The batch recomputation: the alerts silver's events call for."""
    return click_fraud(valid_clicks(events.withColumn("reason", F.lit(None)), settings),
                       settings.alert_clicks_per_minute)


def _records(spark: SparkSession, settings: Settings) -> DataFrame:
    """Bronze-shaped records as they arrive: the Kafka topic's messages, or bronze's rows."""
    if settings.source == "kafka":
        return bronze.records_from_kafka(bronze.kafka_messages(spark, settings),
                                         kafka_topic.topic_id(settings) or "unknown")
    return spark.readStream.format("delta").load(bronze.TABLE.path(settings))


def stream(spark: SparkSession, settings: Settings) -> DataFrame:
    """The alerts of each micro-batch: minutes that went (or are still) over the limit."""
    validated = validate(maybe_clicks(_records(spark, settings)), Rules.from_settings(settings))
    clicks = (valid_clicks(validated, settings)
              .withWatermark("event_time", spark_interval(settings.alert_watermark_delay))
              .dropDuplicatesWithinWatermark(["event_id"]))
    return click_fraud(clicks, settings.alert_clicks_per_minute)


# Per ops.alerts path, the ids it holds, read once a process (a minute still in the
# stream's state is emitted again whenever it grows, and must not be raised again); the
# stream is the table's one writer, so what it appends keeps this whole.
_recorded: dict[str, set[str]] = {}


def _recorded_ids(spark: SparkSession, settings: Settings) -> set[str]:
    path = TABLE.path(settings)
    if path not in _recorded:
        _recorded[path] = {row.alert_id for row in
                           read_table(spark, settings, TABLE).select("alert_id").collect()}
    return _recorded[path]


def raise_alerts(spark: SparkSession, alerts: DataFrame, app_id: str, version: int, *,
                 settings: Settings) -> None:
    """Publish and record the batch's alerts that ``ops.alerts`` does not hold yet.

    Most batches raise nothing: the minutes over the limit are collected (a handful), and
    only a batch with a new one touches Kafka and the table."""
    checkpoint = settings.checkpoint(QUERY_NAME)
    candidates = alerts.persist()
    try:
        recorded = _recorded_ids(spark, settings)
        new_ids = [row.alert_id for row in candidates.select("alert_id").collect()
                   if row.alert_id not in recorded]
        if not new_ids:
            return
        new = (candidates.where(F.col("alert_id").isin(new_ids))
               .select(*SCHEMA.fieldNames()[:-1],
                       F.lit(planned_time(checkpoint, version)).alias("raised_at")))
        if settings.source == "kafka":
            publish(new, settings)
        crash_point(f"{QUERY_NAME}.after_publish")
        append_once(new, TABLE.path(settings), checkpoint, version, app_id=app_id,
                    stamp_column="raised_at", key_column="alert_id")
        recorded.update(new_ids)
    finally:
        candidates.unpersist()


def publish(alerts: DataFrame, settings: Settings) -> None:
    """Send ``alerts`` (a handful of rows) to ``alert_topic`` from the driver, keyed by
    alert id, each a JSON object (times in ISO-8601 with their offset)."""
    value = F.to_json(F.struct(*SCHEMA.fieldNames()),
                      {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"})
    messages = [(row.key.encode(), row.value.encode()) for row in
                alerts.select(F.col("alert_id").alias("key"), value.alias("value")).collect()]
    if settings.kafka_bootstrap_servers not in _producers:
        _producers[settings.kafka_bootstrap_servers] = kafka_topic.producer(settings)
    kafka_topic.send(_producers[settings.kafka_bootstrap_servers], settings.alert_topic,
                     messages)


# One producer per broker for the process: making one (connection, idempotent producer id)
# cost about 0.4 s of every batch that raised an alert.
_producers: dict[str, Producer] = {}


def alert_topic_settings(settings: Settings) -> Settings:
    """The settings that point ``kafka_topic``'s helpers at the alert topic."""
    return settings.replace(kafka_topic=settings.alert_topic)


def start(spark: SparkSession, settings: Settings, trigger: dict[str, object]
          ) -> StreamingQuery:
    ensure_table(spark, settings, TABLE)
    _recorded.pop(TABLE.path(settings), None)  # read again: a reset may have emptied it
    if settings.source == "kafka":
        kafka_topic.ensure_topic(alert_topic_settings(settings))
    else:
        ensure_table(spark, settings, bronze.TABLE)
    # Updates only: a minute's alert is emitted by the batch whose clicks put it over the
    # limit, never by one without data (Spark's, after every batch that moved the watermark,
    # only to drop expired state: about half a second each time).
    return start_exactly_once(stream(spark, settings), settings, QUERY_NAME, raise_alerts,
                              trigger, output_mode="update", batches_without_data=False)
