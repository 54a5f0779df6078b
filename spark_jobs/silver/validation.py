"""Bronze records to typed, validated events: the pure transform behind silver.

``validate`` turns bronze rows into one row each carrying either the typed event or the
reason it was rejected. The streaming job and batch reprocessing both call it, so both
reach the same verdict on the same record. Each record is read once by a JVM function of
the project's own (``lakehouse.RecordFacts``, jars/validation), which answers with Spark's
own parser and conversions; the rules are built-in Spark functions over its answers. No
Python in the data path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DecimalType,
    DoubleType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from spark_jobs import reasons
from spark_jobs.config import Settings, interval_seconds

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

EVENT_TYPES = ("view", "click", "purchase")
CONTRACT_FIELDS = ("event_id", "event_time", "event_type", "ad_id", "user_id", "page_id",
                   "ad_type", "ip_address", "price")
# Epoch milliseconds outside 1970..2100 are typos, not times.
EPOCH_MS_MAX = 4_102_444_800_000
ISO_WITH_ZONE = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
INTEGER_TEXT = r"^\s*-?\d{1,19}\s*$"


@dataclass(frozen=True)
class Rules:
    """The settings validation depends on; reprocessing can pass others (a parser fix)."""

    future_tolerance_seconds: float
    derive_missing_event_id: bool
    # Spark datetime patterns accepted besides the contract's formats, read as UTC: how a
    # parser fix for a producer's format reaches silver (and reprocessing recovers the
    # records quarantined before it).
    extra_time_formats: tuple[str, ...] = ()
    # Off for producers that send no price at all (the Yahoo Streaming Benchmark's): a
    # purchase without one is kept with a NULL price, no revenue. A price that is there
    # must still be a number >= 0.
    purchase_requires_price: bool = True

    @classmethod
    def from_settings(cls, settings: Settings) -> Rules:
        return cls(interval_seconds(settings.future_tolerance), settings.derive_missing_event_id,
                   settings.extra_event_time_formats, settings.purchase_requires_price)


# The struct ``lakehouse.RecordFacts`` (jars/validation, a JVM function of the project's
# own) returns for a record: whether it is JSON, of how many fields when an object, how many
# contract fields it has, then per contract field its kind and text, then event_time and
# price as numbers where they are JSON numbers, the fields the contract does not name, and
# whether it holds U+FFFD.
# Its answers are Spark's own (its parser, its conversions); see the Java source for why it
# is a function.
RECORD_FACTS = "lakehouse_record_facts"
RECORD_FACTS_CLASS = "lakehouse.RecordFacts"
RECORD_FACTS_SCHEMA = StructType([
    StructField("is_json", BooleanType(), False),
    StructField("fields", IntegerType()),  # NULL unless the record is a JSON object
    StructField("contract_fields", IntegerType()),
    *[field for name in CONTRACT_FIELDS for field in (
        # STRING, NUMBER, VOID (JSON null), BOOLEAN, OBJECT, ARRAY; NULL where absent.
        StructField(f"kind_{name}", StringType()),
        # try_variant_get(value, '$', 'string'): the string, or a number's text.
        StructField(f"text_{name}", StringType()))],
    StructField("event_time_number", DoubleType()),
    StructField("price_number", DecimalType(38, 8)),
    # to_json of a map<string,variant> of them; NULL when there are none.
    StructField("unknown_fields", StringType()),
    # The record holds U+FFFD: bronze's mark for bytes that were not UTF-8.
    StructField("marked_invalid", BooleanType(), False),
])
STRING, NUMBER, JSON_NULL = "STRING", "NUMBER", "VOID"


def _record_facts(spark: SparkSession) -> Column:
    """The function's column over ``raw``, registered in ``spark`` (again: it reads the
    session's JSON settings where it is registered)."""
    spark.udf.registerJavaFunction(RECORD_FACTS, RECORD_FACTS_CLASS, RECORD_FACTS_SCHEMA)
    # As UTF-8 bytes, which the function parses faster than the string Spark would decode.
    return F.call_function(RECORD_FACTS, F.col("raw").cast("binary"))


def _facts(name: str) -> Column:
    return F.col(f"_facts.{name}")


def _kind(name: str) -> Column:
    return F.col(f"_kind_{name}")


def _field_text(name: str) -> Column:
    return F.col(f"_text_{name}")


def _blank(name: str) -> Column:
    """Absent, JSON null, or a string of blanks."""
    kind = _kind(name)
    return (kind.isNull() | (kind == JSON_NULL)
            | ((kind == STRING) & (F.trim(_field_text(name)) == "")))


def _epoch_ms_time(millis: Column) -> Column:
    in_range = (millis >= 0) & (millis < EPOCH_MS_MAX)
    return F.when(in_range, F.timestamp_millis(millis))


def _time_of(kind: Column, text: Column, number: Column,
             extra_formats: tuple[str, ...]) -> Column:
    """ISO-8601 with Z or an offset, or epoch milliseconds as a number or numeric string;
    then any of ``extra_formats`` (Spark datetime patterns, read as UTC)."""
    trimmed = F.trim(text)
    # The spellings exclude each other; ISO-8601, the common one, is tried first so that it
    # takes one regular expression, not two (3 million times: 1.45-1.49 s against
    # 1.77-1.91 s, alternated).
    from_text = (F.when(trimmed.rlike(ISO_WITH_ZONE), trimmed.try_cast("timestamp"))
                 .when(trimmed.rlike(INTEGER_TEXT), _epoch_ms_time(trimmed.try_cast("long"))))
    if extra_formats:
        from_text = from_text.otherwise(F.coalesce(
            *[F.try_to_timestamp(trimmed, F.lit(pattern)) for pattern in extra_formats]))
    from_number = _epoch_ms_time(F.floor(number).try_cast("long"))
    return F.when(kind == STRING, from_text).when(kind == NUMBER, from_number)


def parse_event_time(value: Column, extra_formats: tuple[str, ...] = ()) -> Column:
    """``_time_of`` for a VARIANT value (a campaign mapping's ``valid_from``): the times
    events accept, read with built-in expressions where few records need them."""
    kind = F.schema_of_variant(value)
    number = kind.isin("BIGINT", "DOUBLE", "FLOAT", "INT", "SMALLINT", "TINYINT") | (
        kind.startswith("DECIMAL"))
    return _time_of(F.when(kind == "STRING", F.lit(STRING)).when(number, F.lit(NUMBER)),
                    F.try_variant_get(value, "$", "string"),
                    F.try_variant_get(value, "$", "double"), extra_formats)


def _price_of(kind: Column, text: Column, number: Column) -> Column:
    """A number or numeric string as decimal(12,2) (rounded half up); NULL otherwise."""
    exact = (F.when(kind == NUMBER, number)
             .when(kind == STRING, F.trim(text).try_cast("decimal(38,8)")))
    return exact.try_cast("decimal(12,2)")


def _parsed_again() -> Column:
    """The record as a VARIANT: parsed a second time, so only where a rare column needs it
    (a rejected record's detail, a derived event_id)."""
    return F.try_parse_json("raw")


def _shown(name: str) -> Column:
    """A field's JSON text, short enough for a detail message."""
    value = F.try_variant_get(_parsed_again(), f"$.{name}", "variant")
    return F.coalesce(F.substring(F.to_json(value), 1, 80), F.lit("absent"))


def validate(bronze: DataFrame, rules: Rules) -> DataFrame:
    """Bronze rows to bronze rows plus typed event columns, ``reason`` and ``detail``.

    ``reason`` is NULL for a valid event, else the first broken rule in
    ``reasons.PRECEDENCE``; ``detail`` names every rule the record broke.

    Each record is read once (``RECORD_FACTS``), in a projection of its own: Spark keeps a
    projection whose costly columns are used several times apart from the next one instead
    of inlining (and so re-evaluating) them. Built-in expressions over a VARIANT cost twice
    as much (300,000 records to the ``noop`` sink, warm: 5.0-5.7 s against 2.9-3.1 s),
    building a literal, a cast and a configuration for every scalar they take out. The
    rules are plain ``CASE WHEN`` columns, which Spark compiles into one method with the
    rest; a higher-order function (``filter``, ``map_filter``) anywhere in the projection
    would keep it out of that method (the rescued fields' ``map_filter`` cost a third of
    validation's time), so the reader writes them. The rare columns that need the record as
    a VARIANT (a rejected record's detail, a derived event_id) parse it again, only where
    they are evaluated.
    """
    facts = bronze.withColumn("_facts", _record_facts(bronze.sparkSession)).select(
        "*",
        *[_facts(f"kind_{name}").alias(f"_kind_{name}") for name in CONTRACT_FIELDS],
        *[_facts(f"text_{name}").alias(f"_text_{name}") for name in CONTRACT_FIELDS])

    present = facts.select(
        "*",
        _time_of(_kind("event_time"), _field_text("event_time"),
                 _facts("event_time_number"), rules.extra_time_formats).alias("_event_time"),
        F.lower(F.trim(_field_text("event_type"))).alias("_event_type"),
        _price_of(_kind("price"), _field_text("price"), _facts("price_number"))
        .alias("_price"),
        _blank("event_id").alias("_id_missing"),
        F.coalesce(_facts("fields") > 0, F.lit(False)).alias("_is_object"))

    fields = _facts("fields")
    event_time, event_type, price = F.col("_event_time"), F.col("_event_type"), F.col("_price")
    id_missing, is_object = F.col("_id_missing"), F.col("_is_object")
    time_absent = _kind("event_time").isNull() | (_kind("event_time") == JSON_NULL)
    price_absent = _kind("price").isNull() | (_kind("price") == JSON_NULL)
    checks: list[tuple[str, Column, Column]] = [
        (reasons.INVALID_ENCODING, _facts("marked_invalid"),
         F.lit("the record has bytes that are not UTF-8")),
        (reasons.MALFORMED_JSON, ~_facts("is_json"),
         F.lit("the record is not valid JSON")),
        (reasons.NOT_AN_OBJECT, _facts("is_json") & fields.isNull(),
         F.concat(F.lit("the record is JSON but not an object: "),
                  F.substring("raw", 1, 40))),
        (reasons.EMPTY_RECORD, fields == 0, F.lit("the record has no fields")),
        (reasons.MISSING_EVENT_ID, id_missing & F.lit(not rules.derive_missing_event_id),
         F.concat(F.lit("event_id is missing, null or empty: "), _shown("event_id"))),
        (reasons.INVALID_EVENT_ID, ~id_missing & (_kind("event_id") != STRING),
         F.concat(F.lit("event_id is not a string: "), _shown("event_id"))),
        (reasons.MISSING_EVENT_TIME, time_absent, F.lit("event_time is missing or null")),
        (reasons.BAD_EVENT_TIME, ~time_absent & event_time.isNull(),
         F.concat(F.lit("event_time is neither ISO-8601 with a zone nor epoch milliseconds: "),
                  _shown("event_time"))),
        (reasons.FUTURE_EVENT_TIME,
         event_time > F.col("ingested_at")
         + F.make_interval(secs=F.lit(rules.future_tolerance_seconds)),
         F.concat(F.lit("event_time is more than the tolerance after ingestion: "),
                  event_time.cast("string"))),
        (reasons.MISSING_EVENT_TYPE, _blank("event_type"),
         F.lit("event_type is missing, null or empty")),
        (reasons.UNKNOWN_EVENT_TYPE,
         ~_blank("event_type") & ~F.coalesce(
             (_kind("event_type") == STRING) & event_type.isin(*EVENT_TYPES), F.lit(False)),
         F.concat(F.lit("event_type is not view, click or purchase: "),
                  _shown("event_type"))),
        (reasons.MISSING_AD_ID, _blank("ad_id"), F.lit("ad_id is missing, null or empty")),
        (reasons.INVALID_AD_ID, ~_blank("ad_id") & (_kind("ad_id") != STRING),
         F.concat(F.lit("ad_id is not a string: "), _shown("ad_id"))),
        (reasons.BAD_PRICE, (event_type == "purchase") & F.coalesce(price < 0, F.lit(True))
         & ~(price_absent & F.lit(not rules.purchase_requires_price)),
         F.concat(F.lit("a purchase needs a price >= 0: "), _shown("price"))),
    ]
    assert [code for code, _, _ in checks] == list(reasons.PRECEDENCE)
    structural = {reasons.INVALID_ENCODING, reasons.MALFORMED_JSON, reasons.NOT_AN_OBJECT,
                  reasons.EMPTY_RECORD}
    judged = present.select("*", *[
        F.coalesce(condition if code in structural else is_object & condition, F.lit(False))
        .alias(f"_broke_{code}") for code, condition, _ in checks])

    derived_id = F.concat(F.lit("derived-"), F.sha2(F.to_json(_parsed_again()), 256))
    derive = id_missing & F.lit(rules.derive_missing_event_id)
    return judged.select(
        *bronze.columns,
        F.coalesce(*[F.when(F.col(f"_broke_{code}"), F.lit(code)) for code, _, _ in checks])
        .alias("reason"),
        F.concat_ws("; ", *[F.when(F.col(f"_broke_{code}"), message)
                            for code, _, message in checks]).alias("detail"),
        F.when(derive, derived_id).otherwise(_field_text("event_id")).alias("event_id"),
        event_time.alias("event_time"),
        F.to_date(event_time).alias("event_date"),
        event_type.alias("event_type"),
        _field_text("user_id").alias("user_id"),
        _field_text("page_id").alias("page_id"),
        _field_text("ad_id").alias("ad_id"),
        F.lower(F.trim(_field_text("ad_type"))).alias("ad_type"),
        _field_text("ip_address").alias("ip_address"),
        F.when(event_type == "purchase", price).alias("price"),
        _facts("unknown_fields").alias("_rescued"),
        derive.alias("event_id_derived"),
    )
