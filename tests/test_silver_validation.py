"""Every messy kind of contract section 3, one inline record each, and its verdict."""

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
