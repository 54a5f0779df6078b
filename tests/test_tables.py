"""Table helpers: rows the driver holds become a DataFrame without Python workers."""

from datetime import UTC, date, datetime
from decimal import Decimal

from pyspark.sql.types import (
    DateType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.tables import local_rows

SCHEMA = StructType([
    StructField("name", StringType(), False),
    StructField("n", LongType()),
    StructField("day", DateType()),
    StructField("at", TimestampType()),
    StructField("amount", DecimalType(12, 2)),
])


def test_local_rows_keep_every_value_and_type(spark) -> None:
    moment = datetime(2026, 11, 22, 10, 15, 30, tzinfo=UTC)
    rows = [("a", 1, date(2026, 11, 22), moment, Decimal("9.99")),
            ("b", None, None, None, None)]
    frame = local_rows(spark, rows, SCHEMA)
    assert [f.dataType for f in frame.schema.fields] == [f.dataType for f in SCHEMA.fields]
    got = sorted(frame.collect())
    # The session time zone is UTC, so the aware moment comes back as its UTC wall time.
    assert got[0] == ("a", 1, date(2026, 11, 22), datetime(2026, 11, 22, 10, 15, 30),
                      Decimal("9.99"))
    assert got[1] == ("b", None, None, None, None)


def test_no_rows_is_an_empty_frame_of_the_schema(spark) -> None:
    frame = local_rows(spark, [], SCHEMA)
    assert frame.count() == 0
    assert frame.schema.fieldNames() == SCHEMA.fieldNames()
