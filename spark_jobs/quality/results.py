"""``quality.results``: the history of every validation.

Grain: one row per expectation evaluated in a ``lakehouse validate`` run, with its suite
(the table), severity, outcome, the number of unexpected rows or values, a sample of
what was observed, the date range validated and the Data Docs page that details it.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from datetime import date, datetime

from pyspark.sql.types import (
    BooleanType,
    DateType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.tables import TableSpec

SCHEMA = StructType([
    StructField("run_id", StringType(), False),
    StructField("run_at", TimestampType(), False),
    StructField("suite", StringType(), False),  # the table validated
    StructField("expectation_id", StringType(), False),
    StructField("expectation", StringType(), False),  # its type, e.g. expect_column_...
    StructField("description", StringType(), False),  # what it checks, in words
    StructField("severity", StringType(), False),
    StructField("success", BooleanType(), False),
    StructField("unexpected_count", LongType()),
    StructField("observed", StringType()),  # JSON: observed value or a sample of rows
    StructField("error", StringType()),  # the exception, when it could not be evaluated
    StructField("first_date", DateType()),  # the range validated; null for the whole table
    StructField("last_date", DateType()),
    StructField("details", StringType()),  # Data Docs page, relative to <root>/reports
])

TABLE = TableSpec.declared("quality.results", SCHEMA)


@dataclass(frozen=True)
class Result:
    run_id: str
    run_at: datetime
    suite: str
    expectation_id: str
    expectation: str
    description: str
    severity: str
    success: bool
    unexpected_count: int | None
    observed: str | None
    error: str | None
    first_date: date | None
    last_date: date | None
    details: str | None

    def row(self) -> tuple:
        return astuple(self)
