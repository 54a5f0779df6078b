"""Bronze records to typed, validated events: the pure transform behind silver.

``validate`` turns bronze rows into one row each carrying either the typed event or the
reason it was rejected. The streaming job and batch reprocessing both call it, so both
reach the same verdict on the same record. Everything here is built-in Spark functions
over the VARIANT type: no UDF, no Python in the data path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_jobs import reasons
from spark_jobs.config import Settings, interval_seconds

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

EVENT_TYPES = ("view", "click", "purchase")
CONTRACT_FIELDS = ("event_id", "event_time", "event_type", "ad_id", "user_id", "page_id",
                   "ad_type", "ip_address", "price")
# Epoch milliseconds outside 1970..2100 are typos, not times.
EPOCH_MS_MAX = 4_102_444_800_000
ISO_WITH_ZONE = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
INTEGER_TEXT = r"^\s*-?\d{1,19}\s*$"
NUMBER_TYPES = ("BIGINT", "DOUBLE", "FLOAT", "INT", "SMALLINT", "TINYINT")


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


def _type_of(value: Column) -> Column:
    """'STRING', 'BIGINT', 'DECIMAL(4,2)', 'OBJECT<…>', 'VOID' (JSON null) or NULL (absent)."""
    return F.schema_of_variant(value)


def _is_number(kind: Column) -> Column:
    return kind.isin(*NUMBER_TYPES) | kind.startswith("DECIMAL")


def _text(value: Column) -> Column:
    return F.try_variant_get(value, "$", "string")


def _blank(value: Column, kind: Column, text: Column) -> Column:
    """Absent, JSON null, or a string of blanks."""
    return value.isNull() | (kind == "VOID") | ((kind == "STRING") & (F.trim(text) == ""))


def _epoch_ms_time(millis: Column) -> Column:
    in_range = (millis >= 0) & (millis < EPOCH_MS_MAX)
    return F.when(in_range, F.timestamp_millis(millis))


def _time_of(value: Column, kind: Column, text: Column,
             extra_formats: tuple[str, ...]) -> Column:
    trimmed = F.trim(text)
    from_text = (F.when(trimmed.rlike(INTEGER_TEXT), _epoch_ms_time(trimmed.try_cast("long")))
                 .when(trimmed.rlike(ISO_WITH_ZONE), trimmed.try_cast("timestamp")))
    if extra_formats:
        from_text = from_text.otherwise(F.coalesce(
            *[F.try_to_timestamp(trimmed, F.lit(pattern)) for pattern in extra_formats]))
    from_number = _epoch_ms_time(
        F.floor(F.try_variant_get(value, "$", "double")).try_cast("long"))
    return F.when(kind == "STRING", from_text).when(_is_number(kind), from_number)


def parse_event_time(value: Column, extra_formats: tuple[str, ...] = ()) -> Column:
    """ISO-8601 with Z or an offset, or epoch milliseconds as a number or numeric string;
    then any of ``extra_formats`` (Spark datetime patterns, read as UTC)."""
    return _time_of(value, _type_of(value), _text(value), extra_formats)


def _price_of(value: Column, kind: Column, text: Column) -> Column:
    """A number or numeric string as decimal(12,2) (rounded half up); NULL otherwise."""
    exact = (F.when(_is_number(kind), F.try_variant_get(value, "$", "decimal(38,8)"))
             .when(kind == "STRING", F.trim(text).try_cast("decimal(38,8)")))
    return exact.try_cast("decimal(12,2)")


def _shown(value: Column) -> Column:
    """A field's JSON text, short enough for a detail message."""
    return F.coalesce(F.substring(F.to_json(value), 1, 80), F.lit("absent"))


# Fields whose JSON type decides a rule; the others are only read as text.
TYPED_FIELDS = ("event_id", "event_time", "event_type", "ad_id", "price")


def _value(name: str) -> Column:
    return F.col("_fields")[name]


def _kind(name: str) -> Column:
    return F.col(f"_kind_{name}")


def _field_text(name: str) -> Column:
    return F.col(f"_text_{name}")


def validate(bronze: DataFrame, rules: Rules) -> DataFrame:
    """Bronze rows to bronze rows plus typed event columns, ``reason`` and ``detail``.

    ``reason`` is NULL for a valid event, else the first broken rule in
    ``reasons.PRECEDENCE``; ``detail`` names every rule the record broke.

    Each record is parsed once, and each field's JSON type and text are computed once in a
    projection of their own: Spark keeps a projection whose costly columns are used several
    times apart from the next one instead of inlining (and so re-evaluating) them. The
    rules are plain ``CASE WHEN`` columns, which Spark compiles; higher-order functions
    (``filter``, ``transform``) would be interpreted row by row.
    """
    parsed = (bronze
              .withColumn("_json", F.try_parse_json("raw"))
              .withColumn("_fields", F.try_variant_get("_json", "$", "map<string,variant>")))
    facts = parsed.select(
        "*",
        *[_type_of(_value(name)).alias(f"_kind_{name}") for name in TYPED_FIELDS],
        *[_text(_value(name)).alias(f"_text_{name}") for name in CONTRACT_FIELDS])

    def blank(name: str) -> Column:
        return _blank(_value(name), _kind(name), _field_text(name))

    present = facts.select(
        "*",
        _time_of(_value("event_time"), _kind("event_time"), _field_text("event_time"),
                 rules.extra_time_formats).alias("_event_time"),
        F.lower(F.trim(_field_text("event_type"))).alias("_event_type"),
        _price_of(_value("price"), _kind("price"), _field_text("price")).alias("_price"),
        blank("event_id").alias("_id_missing"),
        (F.col("_fields").isNotNull() & (F.size("_fields") > 0)).alias("_is_object"))

    fields = F.col("_fields")
    event_time, event_type, price = F.col("_event_time"), F.col("_event_type"), F.col("_price")
    id_missing, is_object = F.col("_id_missing"), F.col("_is_object")
    time_absent = _value("event_time").isNull() | (_kind("event_time") == "VOID")
    price_absent = _value("price").isNull() | (_kind("price") == "VOID")
    checks: list[tuple[str, Column, Column]] = [
        (reasons.INVALID_ENCODING, F.col("raw").contains("\ufffd"),
         F.lit("the record has bytes that are not UTF-8")),
        (reasons.MALFORMED_JSON, F.col("_json").isNull(),
         F.lit("the record is not valid JSON")),
        (reasons.NOT_AN_OBJECT, F.col("_json").isNotNull() & fields.isNull(),
         F.concat(F.lit("the record is JSON but not an object: "),
                  F.substring("raw", 1, 40))),
        (reasons.EMPTY_RECORD, F.size(fields) == 0, F.lit("the record has no fields")),
        (reasons.MISSING_EVENT_ID, id_missing & F.lit(not rules.derive_missing_event_id),
         F.concat(F.lit("event_id is missing, null or empty: "), _shown(_value("event_id")))),
        (reasons.INVALID_EVENT_ID, ~id_missing & (_kind("event_id") != "STRING"),
         F.concat(F.lit("event_id is not a string: "), _shown(_value("event_id")))),
        (reasons.MISSING_EVENT_TIME, time_absent, F.lit("event_time is missing or null")),
        (reasons.BAD_EVENT_TIME, ~time_absent & event_time.isNull(),
         F.concat(F.lit("event_time is neither ISO-8601 with a zone nor epoch milliseconds: "),
                  _shown(_value("event_time")))),
        (reasons.FUTURE_EVENT_TIME,
         event_time > F.col("ingested_at")
         + F.make_interval(secs=F.lit(rules.future_tolerance_seconds)),
         F.concat(F.lit("event_time is more than the tolerance after ingestion: "),
                  event_time.cast("string"))),
        (reasons.MISSING_EVENT_TYPE, blank("event_type"),
         F.lit("event_type is missing, null or empty")),
        (reasons.UNKNOWN_EVENT_TYPE,
         ~blank("event_type") & ~F.coalesce(
             (_kind("event_type") == "STRING") & event_type.isin(*EVENT_TYPES), F.lit(False)),
         F.concat(F.lit("event_type is not view, click or purchase: "),
                  _shown(_value("event_type")))),
        (reasons.MISSING_AD_ID, blank("ad_id"), F.lit("ad_id is missing, null or empty")),
        (reasons.INVALID_AD_ID, ~blank("ad_id") & (_kind("ad_id") != "STRING"),
         F.concat(F.lit("ad_id is not a string: "), _shown(_value("ad_id")))),
        (reasons.BAD_PRICE, (event_type == "purchase") & F.coalesce(price < 0, F.lit(True))
         & ~(price_absent & F.lit(not rules.purchase_requires_price)),
         F.concat(F.lit("a purchase needs a price >= 0: "), _shown(_value("price")))),
    ]
    assert [code for code, _, _ in checks] == list(reasons.PRECEDENCE)
    structural = {reasons.INVALID_ENCODING, reasons.MALFORMED_JSON, reasons.NOT_AN_OBJECT,
                  reasons.EMPTY_RECORD}
    judged = present.select("*", *[
        F.coalesce(condition if code in structural else is_object & condition, F.lit(False))
        .alias(f"_broke_{code}") for code, condition, _ in checks])

    derived_id = F.concat(F.lit("derived-"), F.sha2(F.to_json("_json"), 256))
    derive = id_missing & F.lit(rules.derive_missing_event_id)
    # Most records carry only contract fields: the map is filtered (a lambda, interpreted)
    # only for those with more fields than the contract fields they carry.
    known_present = sum((_value(name).isNotNull().cast("int") for name in CONTRACT_FIELDS),
                        F.lit(0))
    known = F.array(*[F.lit(name) for name in CONTRACT_FIELDS])
    unknown_fields = F.map_filter(fields, lambda key, _: ~F.array_contains(known, key))
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
        F.when(F.size(fields) > known_present, F.to_json(unknown_fields)).alias("_rescued"),
        derive.alias("event_id_derived"),
    )
