"""The same three layers as the lakehouse, written plainly with Spark's declarative pipelines.

What a Spark user would write first: the landing files as text, ``from_json`` with a string
schema, the contract's required fields checked with filters, duplicates dropped within the
watermark, and per-campaign, per-minute counts as a materialized view. No quarantine, no
exact deduplication across all history, no late-data ledger, no SCD2 campaign mapping, no
attribution: what ``make bench``'s declarative part compares the lakehouse against
(``spark_jobs/declarative_bench.py``), in speed and in exactness.
"""

from pyspark import pipelines as dp
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

spark = SparkSession.active()
LANDING = spark.conf.get("plain.landing")
SCHEMA = ("event_id string, event_time string, event_type string, ad_id string, "
          "user_id string, page_id string, ad_type string, ip_address string, price string")


def landed_lines():
    return (spark.readStream.format("text").load(f"{LANDING}/events")
            .where(F.trim("value") != "")
            .withColumn("ingested_at", F.current_timestamp()))


@dp.table(format="delta")
def bronze_ad_events():
    return landed_lines()


@dp.table(format="delta")
def silver_ad_events():
    event = F.col("event")
    event_time = F.coalesce(F.try_to_timestamp(event.event_time),
                            F.timestamp_millis(F.expr("try_cast(event.event_time AS BIGINT)")))
    price = F.expr("try_cast(event.price AS DECIMAL(12,2))")
    event_type = F.lower(F.trim(event.event_type))
    # From the landing zone, beside bronze: Spark Connect resolves a deduplication's columns
    # when the flow is registered, before a table of the same run exists to read them from.
    return (landed_lines()
            .select(F.from_json("value", SCHEMA).alias("event"), "ingested_at")
            .select(event.event_id.alias("event_id"), event_time.alias("event_time"),
                    event_type.alias("event_type"), event.ad_id.alias("ad_id"),
                    event.user_id.alias("user_id"), event.page_id.alias("page_id"),
                    event.ad_type.alias("ad_type"), event.ip_address.alias("ip_address"),
                    price.alias("price"), "ingested_at")
            .where((F.length("event_id") > 0) & (F.length("ad_id") > 0)
                   & F.col("event_time").isNotNull()
                   & F.col("event_type").isin("view", "click", "purchase")
                   & ((F.col("event_type") != "purchase") | (F.col("price") >= 0)))
            .withWatermark("event_time", "10 minutes")
            .dropDuplicatesWithinWatermark(["event_id"]))


@dp.materialized_view(format="delta")
def gold_campaign_stats():
    campaigns = (spark.read.schema("ad_id string, campaign_id string, valid_from string")
                 .json(f"{LANDING}/campaigns")
                 .groupBy("ad_id").agg(F.max_by("campaign_id", "valid_from").alias("campaign_id")))
    return (spark.read.table("silver_ad_events").join(campaigns, "ad_id", "left")
            .groupBy(F.coalesce("campaign_id", F.lit("unknown")).alias("campaign_id"),
                     F.window("event_time", "1 minute").alias("window"))
            .agg(F.count_if(F.col("event_type") == "view").alias("views"),
                 F.count_if(F.col("event_type") == "click").alias("clicks"),
                 F.count_if(F.col("event_type") == "purchase").alias("purchases"),
                 F.sum(F.when(F.col("event_type") == "purchase", F.col("price"))).alias("revenue")))
