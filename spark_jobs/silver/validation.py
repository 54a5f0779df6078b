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

    @classmethod
    def from_settings(cls, settings: Settings) -> Rules:
        return cls(interval_seconds(settings.future_tolerance), settings.derive_missing_event_id,
                   settings.extra_event_time_formats)


def _type_of(value: Column) -> Column:
    """'STRING', 'BIGINT', 'DECIMAL(4,2)', 'OBJECT<…>', 'VOID' (JSON null) or NULL (absent)."""
    return F.schema_of_variant(value)


def _is_number(value: Column) -> Column:
    kind = _type_of(value)
    return kind.isin(*NUMBER_TYPES) | kind.startswith("DECIMAL")


def _text(value: Column) -> Column:
    return F.try_variant_get(value, "$", "string")


def _blank(value: Column) -> Column:
    """Absent, JSON null, or a string of blanks."""
    return value.isNull() | (_type_of(value) == "VOID") | (
        (_type_of(value) == "STRING") & (F.trim(_text(value)) == ""))


def _epoch_ms_time(millis: Column) -> Column:
    in_range = (millis >= 0) & (millis < EPOCH_MS_MAX)
    return F.when(in_range, F.timestamp_millis(millis))


def parse_event_time(value: Column, extra_formats: tuple[str, ...] = ()) -> Column:
    """ISO-8601 with Z or an offset, or epoch milliseconds as a number or numeric string;
    then any of ``extra_formats`` (Spark datetime patterns, read as UTC)."""
    text = F.trim(_text(value))
    from_text = (F.when(text.rlike(INTEGER_TEXT), _epoch_ms_time(text.try_cast("long")))
                 .when(text.rlike(ISO_WITH_ZONE), text.try_cast("timestamp")))
    if extra_formats:
        from_text = from_text.otherwise(F.coalesce(
            *[F.try_to_timestamp(text, F.lit(pattern)) for pattern in extra_formats]))
    from_number = _epoch_ms_time(
        F.floor(F.try_variant_get(value, "$", "double")).try_cast("long"))
    return (F.when(_type_of(value) == "STRING", from_text)
            .when(_is_number(value), from_number))


def parse_price(value: Column) -> Column:
    """A number or numeric string as decimal(12,2) (rounded half up); NULL otherwise."""
    exact = (F.when(_is_number(value), F.try_variant_get(value, "$", "decimal(38,8)"))
             .when(_type_of(value) == "STRING", F.trim(_text(value)).try_cast("decimal(38,8)")))
    return exact.try_cast("decimal(12,2)")


def _shown(value: Column) -> Column:
    """A field's JSON text, short enough for a detail message."""
    return F.coalesce(F.substring(F.to_json(value), 1, 80), F.lit("absent"))


def validate(bronze: DataFrame, rules: Rules) -> DataFrame:
    """Bronze rows to bronze rows plus typed event columns, ``reason`` and ``detail``.

    ``reason`` is NULL for a valid event, else the first broken rule in
    ``reasons.PRECEDENCE``; ``detail`` names every rule the record broke.
    """
    fields = F.col("_fields")

    def field(name: str) -> Column:
        return fields[name]

    event_time = parse_event_time(field("event_time"), rules.extra_time_formats)
    event_type = F.lower(F.trim(_text(field("event_type"))))
    price = parse_price(field("price"))
    id_missing = _blank(field("event_id"))
    is_object = fields.isNotNull() & (F.size(fields) > 0)

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
         F.concat(F.lit("event_id is missing, null or empty: "), _shown(field("event_id")))),
        (reasons.INVALID_EVENT_ID, ~id_missing & (_type_of(field("event_id")) != "STRING"),
         F.concat(F.lit("event_id is not a string: "), _shown(field("event_id")))),
        (reasons.MISSING_EVENT_TIME,
         field("event_time").isNull() | (_type_of(field("event_time")) == "VOID"),
         F.lit("event_time is missing or null")),
        (reasons.BAD_EVENT_TIME,
         field("event_time").isNotNull() & (_type_of(field("event_time")) != "VOID")
         & event_time.isNull(),
         F.concat(F.lit("event_time is neither ISO-8601 with a zone nor epoch milliseconds: "),
                  _shown(field("event_time")))),
        (reasons.FUTURE_EVENT_TIME,
         event_time > F.col("ingested_at")
         + F.make_interval(secs=F.lit(rules.future_tolerance_seconds)),
         F.concat(F.lit("event_time is more than the tolerance after ingestion: "),
                  event_time.cast("string"))),
        (reasons.MISSING_EVENT_TYPE, _blank(field("event_type")),
         F.lit("event_type is missing, null or empty")),
        (reasons.UNKNOWN_EVENT_TYPE,
         ~_blank(field("event_type")) & ~F.coalesce(
             (_type_of(field("event_type")) == "STRING") & event_type.isin(*EVENT_TYPES),
             F.lit(False)),
         F.concat(F.lit("event_type is not view, click or purchase: "),
                  _shown(field("event_type")))),
        (reasons.MISSING_AD_ID, _blank(field("ad_id")), F.lit("ad_id is missing, null or empty")),
        (reasons.INVALID_AD_ID, ~_blank(field("ad_id")) & (_type_of(field("ad_id")) != "STRING"),
         F.concat(F.lit("ad_id is not a string: "), _shown(field("ad_id")))),
        (reasons.BAD_PRICE, (event_type == "purchase") & F.coalesce(price < 0, F.lit(True)),
         F.concat(F.lit("a purchase needs a price >= 0: "), _shown(field("price")))),
    ]
    assert [code for code, _, _ in checks] == list(reasons.PRECEDENCE)
    structural = {reasons.INVALID_ENCODING, reasons.MALFORMED_JSON, reasons.NOT_AN_OBJECT,
                  reasons.EMPTY_RECORD}
    failures = F.filter(
        F.array(*[
            F.when(condition if code in structural else is_object & condition,
                   F.struct(F.lit(code).alias("code"), message.alias("message")))
            for code, condition, message in checks]),
        lambda failure: failure.isNotNull())

    derived_id = F.concat(F.lit("derived-"), F.sha2(F.to_json("_json"), 256))
    known = F.array(*[F.lit(name) for name in CONTRACT_FIELDS])
    unknown_fields = F.map_filter(fields, lambda key, _: ~F.array_contains(known, key))
    return (bronze
            .withColumns({"_json": F.try_parse_json("raw"),
                          "_fields": F.from_json("raw", "map<string,variant>")})
            .withColumn("_failures", failures)
            .select(
                *bronze.columns,
                F.try_element_at("_failures", F.lit(1))["code"].alias("reason"),
                F.concat_ws("; ", F.transform("_failures", lambda f: f["message"]))
                .alias("detail"),
                F.when(id_missing & F.lit(rules.derive_missing_event_id), derived_id)
                .otherwise(_text(field("event_id")))
                .alias("event_id"),
                event_time.alias("event_time"),
                F.to_date(event_time).alias("event_date"),
                event_type.alias("event_type"),
                _text(field("user_id")).alias("user_id"),
                _text(field("page_id")).alias("page_id"),
                _text(field("ad_id")).alias("ad_id"),
                F.lower(F.trim(_text(field("ad_type")))).alias("ad_type"),
                _text(field("ip_address")).alias("ip_address"),
                F.when(event_type == "purchase", price).alias("price"),
                F.when(F.size(unknown_fields) > 0, F.to_json(unknown_fields)).alias("_rescued"),
                (id_missing & F.lit(rules.derive_missing_event_id)).alias("event_id_derived"),
            ))
