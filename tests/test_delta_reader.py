"""The Spark-free Delta reader: same rows as Spark wrote, and a process using it exits cleanly."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from spark_jobs import delta_reader

# delta-rs's PyArrow scan aborted about 1 exit in 3 on this machine; 12 clean exits in a row
# with it would happen by chance less than 1% of the time, so this catches a regression.
EXITS = 12


def write_sample(path: Path) -> None:
    write_deltalake(str(path), pa.table({
        "query_name": ["silver_ad_events", "gold_campaign_stats"],
        "batch_id": pa.array([3, 7], pa.int64()),
        "watermark": pa.array([datetime(2026, 11, 23, 10, tzinfo=UTC), None],
                              pa.timestamp("us", "UTC")),
    }))


def test_rows_keep_their_types_and_an_absent_table_reads_as_empty(tmp_path: Path) -> None:
    write_sample(tmp_path / "progress")
    rows = delta_reader.read_rows(tmp_path / "progress", ["batch_id", "query_name"])
    # Only the named columns, ints as ints, NULL as None.
    assert sorted(rows, key=lambda row: row["batch_id"]) == [
        {"batch_id": 3, "query_name": "silver_ad_events"},
        {"batch_id": 7, "query_name": "gold_campaign_stats"}]
    assert delta_reader.read_arrow(tmp_path / "progress").num_rows == 2
    assert delta_reader.read_rows(tmp_path / "missing") == []


def test_a_short_lived_reader_process_exits_cleanly(tmp_path: Path) -> None:
    write_sample(tmp_path / "progress")
    code = ("from spark_jobs import delta_reader; "
            f"print(len(delta_reader.read_rows({str(tmp_path / 'progress')!r})))")
    for _ in range(EXITS):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60)
        assert (done.returncode, done.stdout.strip()) == (0, "2"), done.stderr[-500:]
