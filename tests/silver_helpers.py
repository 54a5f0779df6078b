"""Inline bronze rows for silver tests."""

from __future__ import annotations

from datetime import datetime

INGESTED = datetime(2026, 11, 22, 12, 0, 0)  # UTC, the session zone


def bronze_frame(spark, raws: list[str], ingested_at: datetime = INGESTED,
                 file_name: str = "inline.jsonl"):
    rows = [(f"file:{file_name}:{n}", raw, "file", file_name, n, None, None, None,
             ingested_at, ingested_at.date()) for n, raw in enumerate(raws, start=1)]
    from spark_jobs.bronze.ad_events import SCHEMA
    return spark.createDataFrame(rows, SCHEMA)
