"""Table helpers: rows the driver holds become a DataFrame without Python workers; tables
are created once however many jobs start at the same moment."""

import threading
from concurrent.futures import ThreadPoolExecutor
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

from spark_jobs import delta_reader
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.tables import ensure_table, local_rows
from tests.conftest import make_settings

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


def test_jobs_starting_together_create_a_table_once_and_none_fails(spark, tmp_path) -> None:
    """``make run`` starts the streams and the first validation at one moment, and each
    creates the tables it needs. CREATEs of one empty folder race for its first commit: a
    loser saw the winner's protocol change (ProtocolChangedException), or its folder before
    that commit as "not a Delta table" or as a log without a table (DELTA_TABLE_NOT_FOUND),
    and the validation failed until its retry minutes later. Eight creators at once, in
    four rounds, each a fresh folder."""
    creators = 8
    with ThreadPoolExecutor(creators) as pool:
        for round_ in range(4):
            settings = make_settings(tmp_path / f"round-{round_}")
            start = threading.Barrier(creators)
            created = [pool.submit(_create_after, start, spark, settings)
                       for _ in range(creators)]
            for creation in created:
                creation.result()  # raises what the creator raised
            # One CREATE commit: the others found the table and wrote nothing.
            assert delta_reader.latest_version(bronze.TABLE.path(settings)) == 0


def _create_after(start: threading.Barrier, spark, settings) -> None:
    start.wait()
    ensure_table(spark, settings, bronze.TABLE)
