import gzip
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spark_jobs import reasons
from spark_jobs.expected_counts import ExpectedCounts
from spark_jobs.generator import GenerateRequest, Mess, generate

START = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def run(root: Path, events: int, mess: Mess | None = None, seed: int = 7,
        derive: bool = False) -> ExpectedCounts:
    request = GenerateRequest(events=events, seed=seed, start=START, mess=mess or Mess(),
                              events_per_file=500, derive_missing_event_id=derive)
    return generate(request, root / "events", root / "campaigns", root / "expected.json")


def read_lines(folder: Path) -> list[bytes]:
    lines: list[bytes] = []
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
        lines.extend(data.removeprefix(b"\xef\xbb\xbf").split(b"\n")[:-1])
    return [line.removesuffix(b"\r") for line in lines]


def test_same_seed_same_files(tmp_path: Path) -> None:
    run(tmp_path / "a", 2000)
    run(tmp_path / "b", 2000)
    assert read_lines(tmp_path / "a" / "events") == read_lines(tmp_path / "b" / "events")


def test_counts_add_up_and_match_the_lines_written(tmp_path: Path) -> None:
    counts = run(tmp_path, 3000)
    lines = read_lines(tmp_path / "events")
    non_blank = [line for line in lines if line.strip()]
    # Every record is exactly one of: first delivery of a valid event, redelivery, invalid.
    assert counts.delivered == len(non_blank) == 3000
    assert counts.delivered == counts.valid_distinct + counts.duplicates + counts.invalid
    assert counts.blank_lines == len(lines) - len(non_blank)
    # With the default mess every kind shows up in 3000 records.
    assert counts.duplicates > 0 and counts.invalid > 0 and counts.blank_lines > 0
    assert set(counts.invalid_by_reason) <= set(reasons.PRECEDENCE)


def test_every_file_kind_is_produced_and_no_hidden_file_is_left(tmp_path: Path) -> None:
    run(tmp_path, 5000, Mess(gzip_files=0.5, crlf_files=0.5, bom_files=0.5))
    names = [p.name for p in (tmp_path / "events").iterdir()]
    assert not [n for n in names if n.startswith(".")]
    assert any(n.endswith(".jsonl.gz") for n in names)
    assert any(n.endswith(".jsonl") for n in names)
    raw = [p.read_bytes() for p in (tmp_path / "events").iterdir() if p.suffix == ".jsonl"]
    assert any(b"\r\n" in data for data in raw)
    assert any(data.startswith(b"\xef\xbb\xbf") for data in raw)


def test_a_clean_corpus_is_all_valid(tmp_path: Path) -> None:
    clean = Mess(malformed=0, missing_field=0, bad_time=0, future_time=0, unknown_type=0,
                 bad_price=0, duplicate=0, blank_line=0)
    counts = run(tmp_path, 1000, clean)
    assert (counts.valid_distinct, counts.invalid, counts.duplicates) == (1000, 0, 0)
    events = [json.loads(line) for line in read_lines(tmp_path / "events")]
    assert len({event["event_id"] for event in events}) == 1000


def test_only_malformed_records(tmp_path: Path) -> None:
    others = dict(missing_field=0, bad_time=0, future_time=0, unknown_type=0, bad_price=0)
    counts = run(tmp_path, 600, Mess(malformed=1, duplicate=0, blank_line=0, **others))
    assert counts.valid_distinct == 0
    assert set(counts.invalid_by_reason) == {
        reasons.MALFORMED_JSON, reasons.NOT_AN_OBJECT, reasons.EMPTY_RECORD,
        reasons.INVALID_ENCODING}


def test_derived_event_ids_turn_missing_ids_valid(tmp_path: Path) -> None:
    only_missing = Mess(missing_field=1, malformed=0, bad_time=0, future_time=0,
                        unknown_type=0, bad_price=0, duplicate=0, blank_line=0)
    off = run(tmp_path / "off", 800, only_missing)
    on = run(tmp_path / "on", 800, only_missing, derive=True)
    # Same seed, same records: the missing-id ones move from quarantine to valid.
    assert off.invalid_by_reason[reasons.MISSING_EVENT_ID] > 0
    assert on.invalid_by_reason[reasons.MISSING_EVENT_ID] == 0
    assert on.valid_distinct == off.invalid_by_reason[reasons.MISSING_EVENT_ID]


def test_expected_counts_accumulate_over_runs(tmp_path: Path) -> None:
    first = run(tmp_path, 500, seed=1)
    second = run(tmp_path, 700, seed=2)
    totals = json.loads((tmp_path / "expected.json").read_text())
    assert totals["delivered"] == first.delivered + second.delivered == 1200


def test_campaign_mapping_moves_some_ads(tmp_path: Path) -> None:
    run(tmp_path, 10)
    files = sorted((tmp_path / "campaigns").iterdir())
    initial, moved = ([json.loads(line) for line in f.read_text().splitlines()] for f in files)
    assert len(initial) == 1000  # 100 campaigns x 10 ads, as in YSB
    assert {row["ad_id"] for row in moved} <= {row["ad_id"] for row in initial}


def test_rates_outside_zero_to_one_are_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        Mess(malformed=1.5)
    with pytest.raises(ValueError, match="add up to"):
        Mess(malformed=0.6, bad_time=0.6)


def test_a_span_spreads_event_time_over_a_day_ending_at_start(tmp_path: Path) -> None:
    from datetime import timedelta

    request = GenerateRequest(events=2000, seed=3, start=START, mess=Mess(late=0, future_time=0),
                              events_per_file=500, span=timedelta(days=1))
    generate(request, tmp_path / "events", tmp_path / "campaigns", tmp_path / "expected.json")
    # Four files: the first written a whole span before START, each next a quarter later,
    # and nothing after START (an event's time is at most 5 s before its file's moment).
    hours = set()
    for line in read_lines(tmp_path / "events"):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        moment = record.get("event_time") if isinstance(record, dict) else None
        if isinstance(moment, str) and moment.endswith("Z") and "T" in moment:
            try:
                when = datetime.fromisoformat(moment.replace("Z", "+00:00"))
            except ValueError:
                continue  # a deliberately bad time
            assert START - timedelta(days=1, seconds=5) <= when <= START
            hours.add(round((START - when).total_seconds() / 3600))
    assert hours == {24, 18, 12, 6}
