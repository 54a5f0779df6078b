"""Every messy kind of contract section 3, one inline record each, and its verdict."""

import itertools
import json
from datetime import datetime
from decimal import Decimal

import pytest

from spark_jobs import reasons
from spark_jobs.silver.validation import Rules, validate
from tests.silver_helpers import bronze_frame

RULES = Rules(future_tolerance_seconds=24 * 3600, derive_missing_event_id=False)


def event(**changes: object) -> str:
    base: dict[str, object] = {"event_id": "e-1", "event_time": "2026-11-22T10:15:30.123Z",
                               "event_type": "view", "ad_id": "ad-1", "user_id": "u-1",
                               "page_id": "p-1", "ad_type": "banner", "ip_address": "1.2.3.4"}
    base.update(changes)
    return json.dumps({k: v for k, v in base.items() if v is not ...}, ensure_ascii=False)


def verdict(spark, raw: str, rules: Rules = RULES):
    return validate(bronze_frame(spark, [raw]), rules).first()


BROKEN = [
    ("not json at all", reasons.MALFORMED_JSON),
    ('{"event_id": "e-1", "event_time": ', reasons.MALFORMED_JSON),  # truncated
    ('{"event_id": "e-1",}', reasons.MALFORMED_JSON),
    ("[1, 2, 3]", reasons.NOT_AN_OBJECT),
    ("null", reasons.NOT_AN_OBJECT),
    ('"just a string"', reasons.NOT_AN_OBJECT),
    ("{}", reasons.EMPTY_RECORD),
    (event(ad_type="ban\ufffdner"), reasons.INVALID_ENCODING),  # bronze's mark for bad bytes
    (event(event_id=...), reasons.MISSING_EVENT_ID),
    (event(event_id=None), reasons.MISSING_EVENT_ID),
    (event(event_id="  "), reasons.MISSING_EVENT_ID),
    (event(event_id=42), reasons.INVALID_EVENT_ID),
    (event(event_time=...), reasons.MISSING_EVENT_TIME),
    (event(event_time=None), reasons.MISSING_EVENT_TIME),
    (event(event_time=""), reasons.BAD_EVENT_TIME),
    (event(event_time="yesterday"), reasons.BAD_EVENT_TIME),
    (event(event_time="2026-11-22T10:15:30"), reasons.BAD_EVENT_TIME),  # no zone
    (event(event_time="2026-11-22 10:15:30Z"), reasons.BAD_EVENT_TIME),  # no T
    (event(event_time="2026-13-45T00:00:00Z"), reasons.BAD_EVENT_TIME),
    (event(event_time=-5), reasons.BAD_EVENT_TIME),  # before 1970: a typo, not a time
    (event(event_time=[2026]), reasons.BAD_EVENT_TIME),
    # 24 h after ingestion (12:00) is allowed; a millisecond more is clock skew.
    (event(event_time="2026-11-23T12:00:00.001Z"), reasons.FUTURE_EVENT_TIME),
    (event(event_type=...), reasons.MISSING_EVENT_TYPE),
    (event(event_type=""), reasons.MISSING_EVENT_TYPE),
    (event(event_type="impression"), reasons.UNKNOWN_EVENT_TYPE),
    (event(event_type=3), reasons.UNKNOWN_EVENT_TYPE),
    (event(ad_id=...), reasons.MISSING_AD_ID),
    (event(ad_id=""), reasons.MISSING_AD_ID),
    (event(ad_id={"id": 1}), reasons.INVALID_AD_ID),
    (event(event_type="purchase"), reasons.BAD_PRICE),  # no price at all
    (event(event_type="purchase", price=None), reasons.BAD_PRICE),
    (event(event_type="purchase", price=-0.01), reasons.BAD_PRICE),
    (event(event_type="purchase", price="free"), reasons.BAD_PRICE),
    (event(event_type="purchase", price=True), reasons.BAD_PRICE),
    (event(event_type="purchase", price=1e12), reasons.BAD_PRICE),  # beyond decimal(12,2)
]


@pytest.fixture(scope="module")
def broken_verdicts(spark) -> dict[str, object]:
    """All broken records validated in one Spark job, by raw text."""
    rows = validate(bronze_frame(spark, [raw for raw, _ in BROKEN]), RULES).collect()
    return {row.raw: row for row in rows}


@pytest.mark.parametrize(("raw", "reason"), BROKEN)
def test_each_broken_rule_has_its_reason(broken_verdicts, raw: str, reason: str) -> None:
    row = broken_verdicts[raw]
    assert row.reason == reason
    assert row.detail  # a human-readable sentence, never empty
    assert row.raw == raw  # quarantine keeps the raw text exactly


def test_first_broken_rule_is_the_reason_and_detail_names_all(spark) -> None:
    row = verdict(spark, event(event_id=..., event_type="hover"))
    assert row.reason == reasons.MISSING_EVENT_ID  # earlier in the precedence
    assert "event_id" in row.detail and "event_type" in row.detail


@pytest.mark.parametrize(("time_value", "expected"), [
    ("2026-11-22T10:15:30.123Z", datetime(2026, 11, 22, 10, 15, 30, 123000)),
    ("2026-11-22T11:15:30+01:00", datetime(2026, 11, 22, 10, 15, 30)),
    ("2026-11-21T23:30:00-05:00", datetime(2026, 11, 22, 4, 30)),  # another UTC date
    (1763806530123, datetime(2025, 11, 22, 10, 15, 30, 123000)),
    ("1763806530123", datetime(2025, 11, 22, 10, 15, 30, 123000)),  # YSB's spelling
    (" 1763806530123 ", datetime(2025, 11, 22, 10, 15, 30, 123000)),
    # Exactly 24 h after ingestion is still inside the tolerance.
    ("2026-11-23T12:00:00Z", datetime(2026, 11, 23, 12, 0)),
])
def test_every_accepted_time_spelling_becomes_utc(spark, time_value, expected) -> None:
    row = verdict(spark, event(event_time=time_value))
    assert row.reason is None, row.detail
    assert row.event_time == expected
    assert row.event_date == expected.date()


def test_valid_event_is_typed_and_normalised(spark) -> None:
    raw = event(event_type="  PURCHASE ", price="12.345", ad_type=" Banner",
                page_id="página-日本", device={"os": "ios", "v": [1, 2]}, build=7)
    row = verdict(spark, raw)
    assert row.reason is None and row.detail == ""
    assert row.event_type == "purchase"
    assert row.ad_type == "banner"
    assert row.price == Decimal("12.35")  # decimal(12,2), half up
    assert row.page_id == "página-日本"
    # Fields the contract does not name survive, with their JSON types.
    assert json.loads(row._rescued) == {"device": {"os": "ios", "v": [1, 2]}, "build": 7}
    assert row.event_id_derived is False


def test_price_is_ignored_for_views_and_an_unknown_ad_type_is_kept(spark) -> None:
    row = verdict(spark, event(price="not a number", ad_type="Hologram"))
    assert row.reason is None
    assert row.price is None
    assert row.ad_type == "hologram"
    assert row._rescued is None


def test_a_repeated_key_is_quarantined_without_failing_the_batch(spark) -> None:
    row = verdict(spark, '{"event_id":"a","event_id":"b","event_time":1763806530123,'
                         '"event_type":"view","ad_id":"x"}')
    # Which event_id would it be? Spark's JSON parser refuses duplicate keys rather than
    # silently picking one, so the record is quarantined as malformed, not kept as "a" or "b".
    assert row.reason == reasons.MALFORMED_JSON


def test_a_one_mebibyte_line_is_handled(spark) -> None:
    row = verdict(spark, event(payload="x" * (1024 * 1024)))
    assert row.reason is None
    assert len(json.loads(row._rescued)["payload"]) == 1024 * 1024


def test_derived_event_ids_are_deterministic_and_marked(spark) -> None:
    rules = Rules(future_tolerance_seconds=86400, derive_missing_event_id=True)
    ysb = ('{"user_id":"u","page_id":"p","ad_id":"a","ad_type":"mail","event_type":"view",'
           '"event_time":"1763806530123","ip_address":"1.1.1.1"}')
    reordered = ('{"page_id":"p","user_id":"u","ad_id":"a","ad_type":"mail",'
                 '"event_type":"view","event_time":"1763806530123","ip_address":"1.1.1.1"}')
    first, second = (verdict(spark, raw, rules) for raw in (ysb, reordered))
    assert first.reason is None and first.event_id_derived is True
    # The same content, keys in another order: still the same event, so still a duplicate.
    assert first.event_id == second.event_id
    assert first.event_id != verdict(spark, ysb.replace('"u"', '"v"'), rules).event_id


def test_a_purchase_without_a_price_is_allowed_only_when_configured(spark) -> None:
    lenient = Rules(future_tolerance_seconds=86400, derive_missing_event_id=False,
                    purchase_requires_price=False)
    absent, null = event(event_type="purchase"), event(event_type="purchase", price=None)
    # By default a purchase needs a price ...
    assert {verdict(spark, raw).reason for raw in (absent, null)} == {reasons.BAD_PRICE}
    # ... and for a producer that sends none, it is kept with no price (no revenue).
    for raw in (absent, null):
        row = verdict(spark, raw, lenient)
        assert (row.reason, row.event_type, row.price) == (None, "purchase", None)
    # A price that is there must still be a number >= 0, whatever the setting.
    for price in (-1.5, "free"):
        bad = event(event_type="purchase", price=price)
        assert verdict(spark, bad, lenient).reason == reasons.BAD_PRICE
    assert verdict(spark, event(event_type="purchase", price="9.99"), lenient).price == \
        Decimal("9.99")


# Records whose values take every path of the record reader (jars/validation): each JSON
# kind, numbers that Spark's parser keeps as a long, a decimal or a double (an exponent, an
# integer past a long, past 38 digits), an escaped lone surrogate, a key twice, JSON that
# is not an object, text that is not JSON.
READER_EDGES = [
    event(),
    event(event_time=1763806530123, price=12.5, event_type="purchase"),
    event(event_time=1.7638065301239e12, price=1e2),
    event(event_time=-0.0, price=-0),
    event(event_time=12345678901234567890, price=0.000001),
    event(price="1e999"),
    # As producers write them (json.dumps would respell these numbers).
    '{"event_id": "e", "event_time": 1.7638065301239E12, "price": 1.50, "page_id": 2.5e-3}',
    '{"event_id": "e", "event_time": 1e999, "price": 123456789012345678901234567890123456789.5}',
    '{"event_id": "e", "price": 99999999999999999999999999999.999999995, "user_id": -0}',
    event(user_id=123, page_id=1.50, ad_type=True, ip_address=None),
    event(user_id={"nested": [1, {"a": None}]}, page_id=[], ad_type={}),
    event(event_id="\\ud800", ad_id="caf\u00e9 \u2603"),
    '{"event_id": "e\\ud800x", "ad_id": "\\u00e9\\n\\"q\\""}',
    '{"event_id": "a", "event_id": "b"}',
    '{"event_id": "e-1", "zeta": {"b": [1.50, null, "\\u00e9\\t"], "a": true}, "extra": 1e3}',
    '{"user_id": "u", "\\"odd\\nkey\\u0001/é": "x", "": null, "event_idx": []}',
    "{}", "[]", "null", "42", '"text"', "not json", '{"a": ', "",
    # Bronze's mark for bytes that were not UTF-8, in a plain record, in one read from its
    # variant, in a record that is not JSON; and text beyond Latin-1 without the mark.
    event(ad_type="ban\ufffdner"), event(extra="\ufffd"), '{"event_id": \ufffd}',
    event(page_id="\u2603 \u00e9"),
    # Records the reader answers from the parser's tokens alone (contract fields, each a
    # string or null, or an integer event_time), and records that only look like them.
    '{"event_id": "e", "event_time": 1763806530123, "ad_id": "a", "user_id": null}',
    ' \t{"event_id" : "e\\u00e9", "event_time": -5, "price": null}  ',
    '{"event_id": "e", "event_time": 9223372036854775807}',
    '{"event_id": "e", "event_time": 9223372036854775808}',
    '{"event_id": "e", "event_time": 0} {"trailing": 1}',
    '{"event_id": "e", "event_time": 01}', '{"event_id": "e",}', '{"event_id": "e"',
    '{"ad_id": "x", "ad_id": "x"}', '{"event_id": "e", "price": 5}',
    # The reader parses an ASCII record from its bytes and any other from its characters:
    # the mark after the root value (which neither parser reads), a zero byte, which Jackson
    # takes near the start for UTF-16 or UTF-32, and a byte order mark, which it skips.
    '{"event_id": "e"} \ufffd', '{"event_id": "e"}\u0000', '\u0000{"event_id": "e"}',
    '{"\u0000event_id": "e"}', '\ufeff{"event_id": "e"}',
    # Fields the contract does not name, each a string or null, read from the tokens too:
    # written back in the variant's order of keys (String.compareTo: "Z" < "a" < "é"),
    # escaped as the variant escapes them; a key twice, a surrogate in a key or a value, or
    # any other value sends the record the variant's way.
    '{"event_id": "e", "zeta": "z", "\u00e9": null, "Zed": "Z\\"\\\\\\n\\u0001\u00e9\u2603",'
    ' "alpha": "", "event_time": 5}',
    event(user_agent="\u03a9-bot"), event(payload="x" * 70_000),
    '{"event_id": "e", "zeta": "z", "zeta": "z"}', '{"event_id": "e", "\\ud800": "x"}',
    '{"event_id": "e", "zeta": "\\udc00"}', '{"event_id": "e", "zeta": 1.50}',
    '{"event_id": "e", "zeta": "z", "ad_id": "a", "ad_id": "a"}',
    # ASCII records the reader scans itself where each token is spelled one way, and where
    # one is not (a sign, a fraction, an exponent, a leading zero, 19 digits, a long key, a
    # control character, a missing comma, letters after null): Jackson reads those.
    '\r\n{"event_id":"e","event_time":0,"zeta":null,"":"x"}\r\n', "{ }",
    '{"event_id": "e", "event_time": 999999999999999999}', '{"event_id": "e\u007f"}',
    '{"event_id": "e", "event_time": -5}', '{"event_id": "e", "event_time": 1.5}',
    '{"event_id": "e", "event_time": 12e3}', '{"event_id": "e", "event_time": 1234567890123456789}',
    '{"event_id": "e", "event_time": 00}', '{"event_id": "e\u0001"}', '{"event_id": "e"}}',
    '{"event_id": "e" "ad_id": "a"}', '{"event_id": nullx}', '{"event_id": nul}',
    '{"event_id": "e", "' + "k" * 1_001 + '": "v"}', '{"event_id": "e", "zeta": 10}',
    '{"event_id":"e","zeta":"a\u007fb"}',
    # The scan looks for a string's end eight bytes at a time: an escape, a control
    # character and the closing quote at each place within eight bytes.
    *[record for k in range(9) for record in (
        '{"event_id": "' + "e" * k + '\\n' + "f" * 16 + '"}',
        '{"event_id": "' + "e" * k + "\u0001" + "f" * 16 + '"}',
        '{"event_id": "' + "e" * k + '", "ad_id": "' + "a" * 16 + '"}')],
    # Keys whose hashes collide in Jackson's symbol table ("AB" and "B!" hash alike, so do
    # any keys of nine such blocks), as many as make it refuse the record as a hash flood:
    # try_parse_json gives NULL, and the reader does not scan past 150 fields.
    '{"event_id": "e", ' + ", ".join(
        f'"{"".join(blocks)}": null'
        for blocks in itertools.islice(itertools.product(("AB", "B!"), repeat=9), 303)) + "}",
]


def test_the_record_reader_parses_from_bytes_only_ascii_without_zero_bytes(spark) -> None:
    """RecordFacts.isAscii looks at eight bytes at a time, then the tail: a byte that is not
    ASCII, or is zero, is found wherever it is; DEL and the other control bytes are ASCII."""
    is_ascii = spark._jvm.lakehouse.RecordFacts.isAscii
    record = b'{"event_id": "e-1"}'  # 19 bytes: two words of eight, then a tail of three
    assert is_ascii(record)
    for at in range(len(record)):
        for byte, ascii in ((0x00, False), (0x80, False), (0xC3, False), (0xFF, False),
                            (0x01, True), (0x7F, True)):
            changed = record[:at] + bytes([byte]) + record[at + 1:]
            assert is_ascii(changed) is ascii, (at, byte)


def test_the_record_reader_answers_as_spark_built_in_expressions(spark) -> None:
    """RecordFacts is Spark's parser and conversions, read in one pass: the same answers as
    try_parse_json, schema_of_variant and try_variant_get give for every edge record."""
    from pyspark.sql import functions as F

    from spark_jobs.silver import validation

    rows = bronze_frame(spark, READER_EDGES).select(
        "raw", validation._record_facts(spark).alias("facts"),
        F.try_parse_json("raw").alias("json"))
    fields = F.try_variant_get("json", "$", "map<string,variant>")
    known = F.array(*[F.lit(name) for name in validation.CONTRACT_FIELDS])
    contract = F.map_filter(fields, lambda key, _: F.array_contains(known, key))
    expected = rows.select(
        "raw",
        F.col("json").isNotNull().alias("is_json"), F.size(fields).alias("fields"),
        sum((fields[name].isNotNull().cast("int") for name in validation.CONTRACT_FIELDS),
            F.lit(0)).alias("contract_fields"),
        *[column for name in validation.CONTRACT_FIELDS for column in (
            F.schema_of_variant(fields[name]).alias(f"kind_{name}"),
            F.try_variant_get(fields[name], "$", "string").alias(f"text_{name}"))],
        F.try_variant_get(fields["event_time"], "$", "double").alias("event_time_number"),
        F.try_variant_get(fields["price"], "$", "decimal(38,8)").alias("price_number"),
        F.when(F.size(fields) > F.size(contract), F.to_json(F.map_filter(
            fields, lambda key, _: ~F.array_contains(known, key)))).alias("unknown_fields"),
        F.coalesce(F.col("raw").contains("\ufffd"), F.lit(False)).alias("marked_invalid"))
    answered = {row.raw: row.facts.asDict() for row in rows.collect()}
    numbers = ("BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT")
    wanted = expected.collect()
    # The edges hold numbers of each kind Spark's parser keeps.
    spark_kinds = {row[f"kind_{name}"] for row in wanted
                   for name in validation.CONTRACT_FIELDS} - {None}
    assert {"BIGINT", "DOUBLE"} <= spark_kinds, spark_kinds
    assert any(kind.startswith("DECIMAL") for kind in spark_kinds), spark_kinds
    for want in wanted:
        got, want = answered[want.raw], want.asDict()
        raw = want.pop("raw")
        if want["fields"] is None or want["fields"] < 0:  # not an object: no fields at all
            want = {name: None for name in want} | {
                "is_json": want["is_json"], "marked_invalid": want["marked_invalid"]}
        for name in validation.CONTRACT_FIELDS:
            kind = want[f"kind_{name}"]
            if kind is not None and (kind in numbers or kind.startswith("DECIMAL")):
                want[f"kind_{name}"] = "NUMBER"
            elif kind is not None and kind.startswith(("OBJECT", "ARRAY")):
                want[f"kind_{name}"] = kind.split("<")[0]
        for name in ("event_time", "price"):
            if want[f"kind_{name}"] != "NUMBER":  # read as numbers only where they are
                want[f"{name}_number"] = None
        assert got == want, raw
    kinds = {facts[f"kind_{name}"] for facts in answered.values()
             for name in validation.CONTRACT_FIELDS}
    assert kinds == {None, "STRING", "NUMBER", "VOID", "BOOLEAN", "OBJECT", "ARRAY"}
    assert {facts["is_json"] for facts in answered.values()} == {True, False}
    assert {facts["marked_invalid"] for facts in answered.values()} == {True, False}
