"""Fuzzing (issue 15): random bytes, random JSON and near-valid records through bronze and
silver, in batch and streaming. Whatever arrives, the stream keeps going, every delivered
line is one bronze row, every bronze row has exactly one place (silver, quarantine, or a
duplicate of a silver event), and a valid record is never refused.

Hypothesis runs the ``ci`` profile by default: derandomized (the same examples on every
run, so the suite cannot flake) and few examples, since each is a Spark job. For a real
hunt: ``HYPOTHESIS_PROFILE=hunt pytest tests/test_fuzz.py`` (random, many more examples).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from spark_jobs import reasons, streaming
from spark_jobs.audit import account
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.silver import ad_events as silver
from spark_jobs.silver import quarantine
from spark_jobs.silver.validation import CONTRACT_FIELDS, EVENT_TYPES, Rules, validate
from spark_jobs.storage import write_atomically
from tests.conftest import make_settings
from tests.silver_helpers import bronze_frame

settings.register_profile(
    "ci", max_examples=12, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "hunt", max_examples=300, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The checked-in defaults' rules (24 hours of future tolerance, no derived event ids).
RULES = Rules.from_settings(make_settings(Path(tempfile.gettempdir()) / "fuzz"))

ABSENT = object()  # a field left out of the record

# Valid records' times are up to three days before now: never in the future.
NOW = datetime.now(UTC).replace(microsecond=0)
FUTURE = (NOW + timedelta(days=2)).isoformat().replace("+00:00", "Z")  # past the tolerance


def json_values(max_leaves: int = 6) -> st.SearchStrategy[object]:
    scalars = (st.none() | st.booleans() | st.integers() | st.floats()
               | st.text(max_size=12))
    return st.recursive(
        scalars,
        lambda children: (st.lists(children, max_size=3)
                          | st.dictionaries(st.text(max_size=6), children, max_size=3)),
        max_leaves=max_leaves)


@st.composite
def valid_records(draw: st.DrawFn, event_ids: st.SearchStrategy[str]) -> dict[str, object]:
    """A record the contract accepts: both time spellings, every event type."""
    moment = NOW - timedelta(seconds=draw(st.integers(0, 3 * 24 * 3600)),
                             milliseconds=draw(st.integers(0, 999)))
    time_spelling = draw(st.sampled_from(["iso", "millis", "millis_text"]))
    millis = int(moment.timestamp() * 1000)
    event_time = {"iso": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                  "millis": millis, "millis_text": str(millis)}[time_spelling]
    event_type = draw(st.sampled_from(EVENT_TYPES))
    record: dict[str, object] = {
        "event_id": draw(event_ids), "event_time": event_time, "event_type": event_type,
        "ad_id": draw(st.text(min_size=1, max_size=8).filter(lambda s: s.strip())),
        "user_id": draw(st.none() | st.text(max_size=8)),
        "page_id": draw(st.none() | st.text(max_size=8)),
        "ad_type": draw(st.sampled_from(["banner", "video", "mail", None])),
        "ip_address": draw(st.none() | st.ip_addresses().map(str)),
    }
    if event_type == "purchase":
        record["price"] = draw(st.decimals(0, 10_000, places=2).map(str) | st.integers(0, 999))
    return record


# Event ids from a small pool, so the corpus redelivers events (duplicates to deduplicate).
POOLED_IDS = st.sampled_from([f"e-{n}" for n in range(40)]) | st.uuids().map(str)


@st.composite
def near_valid_records(draw: st.DrawFn) -> str:
    """A valid record with one to three fields removed, nulled, retyped, garbled or set
    just past a rule (a negative price, a time in the future), or a field the contract
    does not name added."""
    record = draw(valid_records(POOLED_IDS))
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from([*CONTRACT_FIELDS, "extra"]))
        value = draw(st.sampled_from([ABSENT, None, "", -1, "-0.01", FUTURE])
                     | json_values(3) | st.text(max_size=30) | st.integers())
        if value is ABSENT:
            record.pop(name, None)
        else:
            record[name] = value
    return json.dumps(record, ensure_ascii=draw(st.booleans()))


def unmutated(record: dict[str, object]) -> str:
    return json.dumps(record)


# One line of a landing file: random bytes, random JSON, a near-valid or a valid record.
LINES = st.one_of(
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" ")),
    json_values().map(json.dumps).map(str.encode),
    st.text(max_size=40).map(lambda s: s.replace("\n", " ").encode()),
    near_valid_records().map(str.encode),
    valid_records(POOLED_IDS).map(unmutated).map(str.encode),
)


def records_of(content: bytes) -> list[str]:
    """The non-blank lines of a file as bronze reads them: bytes that are not UTF-8 become
    U+FFFD, a leading byte-order mark and a trailing carriage return go."""
    texts = [line.removeprefix(bronze.BOM).removesuffix("\r")
             for line in content.decode("utf-8", errors="replace").split("\n")]
    return [text for text in texts if text.strip(bronze.BLANKS)]


def quarantined_or_silver(spark, root_settings) -> tuple[dict[str, str], set[str]]:
    held = spark.read.format("delta").load(quarantine.TABLE.path(root_settings))
    rows = spark.read.format("delta").load(silver.TABLE.path(root_settings))
    return ({r.bronze_id: r.reason for r in held.select("bronze_id", "reason").collect()},
            {r.event_id for r in rows.select("event_id").collect()})


@given(lines=st.lists(LINES, min_size=1, max_size=40),
       valid=st.lists(valid_records(st.uuids().map(str)), max_size=5))
def test_validation_gives_every_record_one_well_formed_verdict(spark, lines, valid) -> None:
    """Batch: one row out per bronze row in, a reason from the contract's list or none, the
    valid rows typed as silver declares them, and the untouched valid records valid."""
    raws = [text for line in lines for text in records_of(line)]
    raws += [unmutated(record) for record in valid]
    # Ingested now (naive UTC, the session zone), as the valid records' times assume.
    ingested = datetime.now(UTC).replace(tzinfo=None)
    verdicts = validate(bronze_frame(spark, raws, ingested_at=ingested), RULES)
    rows = verdicts.select("raw", "reason", "detail", *silver.SCHEMA.fieldNames()).collect()

    assert len(rows) == len(raws)
    for row in rows:
        event(row.reason or reasons.VALID)  # --hypothesis-show-statistics: what was covered
        assert row.reason is None or row.reason in reasons.PRECEDENCE, row
        if row.reason is None:
            assert row.event_id and row.event_time and row.ad_id, row
            assert row.event_type in EVENT_TYPES, row
            assert row.event_date == row.event_time.date(), row
        else:
            assert row.detail, row  # a refusal says why
    untouched = {unmutated(record) for record in valid}
    refused_valid = [row for row in rows if row.reason is not None and row.raw in untouched]
    assert not refused_valid, refused_valid


@given(files=st.lists(st.lists(LINES, min_size=1, max_size=60), min_size=1, max_size=4),
       valid=st.lists(valid_records(POOLED_IDS), min_size=1, max_size=20),
       gzipped=st.booleans())
# Each example is two streams on a fresh root, about 25 s: a tenth of the profile's examples.
@settings(max_examples=max(2, settings.default.max_examples // 10), suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
def test_the_stream_places_every_fuzzed_record_exactly_once(spark, tmp_path, files, valid,
                                                             gzipped) -> None:
    """Streaming, bronze then silver: nothing stops the stream, nothing is dropped, the
    audit identity holds, and the quarantine's verdict is the batch validation's."""
    lake = make_settings(Path(tempfile.mkdtemp(dir=tmp_path)) / "lake")
    delivered: list[str] = []
    contents = [b"\n".join(lines) for lines in files]
    contents.append("\n".join(unmutated(record) for record in valid).encode())
    for n, content in enumerate(contents):
        name = f"fuzz-{n}.jsonl" + (".gz" if gzipped else "")
        write_atomically(lake.landing_events, name, gzip.compress(content) if gzipped
                         else content)
        delivered += records_of(content)

    streaming.run_available_now(spark, lake, ["bronze", "silver"])

    landed = spark.read.format("delta").load(bronze.TABLE.path(lake))
    raws = [row.raw for row in landed.select("raw").collect()]
    assert len(raws) == len(delivered)
    # Text that was valid UTF-8 is kept as delivered, line for line.
    assert sorted(raw for raw in raws if "\ufffd" not in raw) == sorted(
        raw for raw in delivered if "\ufffd" not in raw)
    accounting = account(spark, lake)
    assert accounting.identity_holds, accounting.as_json()

    held, events = quarantined_or_silver(spark, lake)
    assert {record["event_id"] for record in valid} <= events
    # One transform, two runners: the stream refused exactly what the batch refuses.
    again = validate(landed, Rules.from_settings(lake)).where(F.col("reason").isNotNull())
    assert {r.bronze_id: r.reason for r in again.select("bronze_id", "reason").collect()} == held
