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
processing-time trigger of its own (``alert_trigger``).

Delivery: at least once. A micro-batch publishes its new alerts to the Kafka topic
``alert_topic`` (when the source is Kafka) and then records them in ``ops.alerts`` with an
insert-only MERGE carrying the batch's transaction identifier. A driver killed between the
two replays the batch: the same alerts, with the same ids, are published again, and
recorded once. An alert already in ``ops.alerts`` is not published again, however much its
minute grows later.
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
from spark_jobs.config import Settings, spark_interval
from spark_jobs.delta_writes import idempotent_dml, planned_time, start_exactly_once
from spark_jobs.faults import crash_point
from spark_jobs.silver.validation import Rules, validate
from spark_jobs.tables import TableSpec, ensure_table
from spark_jobs.tables import read as read_table

if TYPE_CHECKING:
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


def valid_clicks(validated: DataFrame) -> DataFrame:
    """The valid clicks of validated bronze records (``validation.validate``) that name an
    address: ``event_id``, ``event_time``, ``ip_address``."""
    return (validated
            .where(F.col("reason").isNull() & (F.col("event_type") == "click")
                   & (F.trim("ip_address") != ""))
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


def from_silver(events: DataFrame, threshold: int) -> DataFrame:
    """The batch recomputation: the alerts silver's events call for."""
    return click_fraud(valid_clicks(events.withColumn("reason", F.lit(None))), threshold)


def _records(spark: SparkSession, settings: Settings) -> DataFrame:
    """Bronze-shaped records as they arrive: the Kafka topic's messages, or bronze's rows."""
    if settings.source == "kafka":
        return bronze.records_from_kafka(bronze.kafka_messages(spark, settings),
                                         kafka_topic.topic_id(settings) or "unknown")
    return spark.readStream.format("delta").load(bronze.TABLE.path(settings))


def stream(spark: SparkSession, settings: Settings) -> DataFrame:
    """The alerts of each micro-batch: minutes that went (or are still) over the limit."""
    clicks = (valid_clicks(validate(_records(spark, settings), Rules.from_settings(settings)))
              .withWatermark("event_time", spark_interval(settings.alert_watermark_delay))
              .dropDuplicatesWithinWatermark(["event_id"]))
    return click_fraud(clicks, settings.alert_clicks_per_minute)


def raise_alerts(spark: SparkSession, alerts: DataFrame, app_id: str, version: int, *,
                 settings: Settings) -> None:
    """Publish and record the batch's alerts that ``ops.alerts`` does not hold yet."""
    from delta.tables import DeltaTable

    raised_at = planned_time(settings.checkpoint(QUERY_NAME), version)
    recorded = read_table(spark, settings, TABLE).select("alert_id")
    new = (alerts.join(recorded, "alert_id", "left_anti")
           .select(*SCHEMA.fieldNames()[:-1], F.lit(raised_at).alias("raised_at"))
           .persist())
    try:
        if new.isEmpty():
            return
        if settings.source == "kafka":
            publish(new, settings)
        crash_point(f"{QUERY_NAME}.after_publish")
        merge = (DeltaTable.forPath(spark, TABLE.path(settings)).alias("t")
                 .merge(new.alias("s"), "t.alert_id = s.alert_id")
                 .whenNotMatchedInsertAll())
        with idempotent_dml(spark, app_id, version):
            merge.execute()
    finally:
        new.unpersist()


def publish(alerts: DataFrame, settings: Settings) -> None:
    """Send ``alerts`` to ``alert_topic``, keyed by alert id, each a JSON object (times in
    ISO-8601 with their offset)."""
    value = F.to_json(F.struct(*SCHEMA.fieldNames()),
                      {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"})
    (alerts.select(F.col("alert_id").alias("key"), value.alias("value"))
        .write.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap_servers)
        .option("topic", settings.alert_topic)
        .save())


def alert_topic_settings(settings: Settings) -> Settings:
    """The settings that point ``kafka_topic``'s helpers at the alert topic."""
    return settings.replace(kafka_topic=settings.alert_topic)


def start(spark: SparkSession, settings: Settings, trigger: dict[str, object]
          ) -> StreamingQuery:
    ensure_table(spark, settings, TABLE)
    if settings.source == "kafka":
        kafka_topic.ensure_topic(alert_topic_settings(settings))
    else:
        ensure_table(spark, settings, bronze.TABLE)
    # A continuous run polls at the alert path's own pace; --available-now stays as asked.
    own_trigger = ({"processingTime": spark_interval(settings.alert_trigger)}
                   if "processingTime" in trigger else trigger)
    return start_exactly_once(stream(spark, settings), settings, QUERY_NAME, raise_alerts,
                              own_trigger, output_mode="update")
