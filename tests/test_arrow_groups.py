"""``arrow_groups``: the sessions processor's input read by key slices gives what PySpark's own
reader gives, key by key, on Arrow streams shaped as the JVM sends them (a key's rows next to
each other, a key going on into the next batch)."""

from __future__ import annotations

import io

import pyarrow as pa
import pytest
from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer

from spark_jobs.gold import arrow_groups

SCHEMA = pa.schema([("user_id", pa.string()), ("event_us", pa.int64()),
                    ("event_id", pa.string())])


def arrow_stream(batches: list[dict[str, list]]) -> io.BytesIO:
    tables = [pa.record_batch(batch, schema=SCHEMA) for batch in batches]
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        for table in tables:
            writer.write_batch(table)
    sink.seek(0)
    return sink


def groups(read: object, batches: list[dict[str, list]], key_offsets: list[int]) -> list:
    """What a reader yields, as plain values: (mode, key, the key's rows as records)."""
    serializer = TransformWithStateInPandasSerializer(
        timezone="UTC", safecheck=False, assign_cols_by_name=True, prefer_int_ext_dtype=False,
        arrow_max_records_per_batch=10_000, arrow_max_bytes_per_batch=2**31 - 1,
        int_to_decimal_coercion_enabled=False)
    serializer.key_offsets = key_offsets
    result = []
    for mode, key, group in read(serializer, arrow_stream(batches)):
        rows = None if group is None else [
            record for _, frame in group for record in frame.to_dict("records")]
        result.append((mode, key, rows))
    return result


# Three users; "b" goes on from the first batch into the second, and the third batch is
# empty (a partition's stream may end with one).
BATCHES = [
    {"user_id": ["a", "a", "b"], "event_us": [1, 2, 3], "event_id": ["e1", "e2", "e3"]},
    {"user_id": ["b", "b", "c"], "event_us": [4, 5, 6], "event_id": ["e4", "e5", "e6"]},
    {"user_id": [], "event_us": [], "event_id": []},
]


@pytest.mark.parametrize("key_offsets", [[0], [0, 2]])
def test_reading_by_key_slices_gives_what_pyspark_s_reader_gives(key_offsets: list[int]) -> None:
    by_pyspark = groups(TransformWithStateInPandasSerializer.load_stream, BATCHES, key_offsets)
    by_slices = groups(arrow_groups._load_stream, BATCHES, key_offsets)
    assert by_slices == by_pyspark
    if key_offsets == [0]:
        # One group per user, "b"'s rows from both batches in it, then the timer and
        # completion calls.
        assert [(key, [row["event_id"] for row in rows or []]) for _, key, rows in by_slices] == [
            (("a",), ["e1", "e2"]), (("b",), ["e3", "e4", "e5"]), (("c",), ["e6"]),
            (None, []), (None, [])]
    else:
        # Keyed by (user, event): every row is a group of its own.
        assert len(by_slices) == 6 + 2


def test_installed_only_for_the_pyspark_release_it_was_written_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import pyspark

    stock = TransformWithStateInPandasSerializer.load_stream
    monkeypatch.setattr(TransformWithStateInPandasSerializer, "load_stream", stock)
    monkeypatch.setattr(pyspark, "__version__", "4.3.0")
    assert not arrow_groups.install()
    assert TransformWithStateInPandasSerializer.load_stream is stock
    monkeypatch.setattr(pyspark, "__version__", "4.2.0")
    assert arrow_groups.install()
    assert TransformWithStateInPandasSerializer.load_stream is arrow_groups._load_stream
