"""Table helpers: rows the driver holds become a DataFrame without Python workers; tables
are created once however many jobs start at the same moment."""

import json
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DateType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs import delta_reader, tables
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import PROJECT_DIR
from spark_jobs.datasets import TABLES
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


def test_a_table_is_ensured_once_until_its_log_is_gone_or_its_name_points_elsewhere(
        spark, tmp_path, monkeypatch) -> None:
    """Jobs ensure a table before every use (the stream runner before each progress flush):
    after the first time in a Spark application that does no Delta or catalog work, unless
    the table was wiped or its name was pointed at another root's table meanwhile."""
    created: list[str] = []
    create = tables._create_and_register

    def counted(spark, settings, spec) -> None:
        created.append(str(settings.root))
        create(spark, settings, spec)

    monkeypatch.setattr(tables, "_create_and_register", counted)
    lake, other = make_settings(tmp_path / "lake"), make_settings(tmp_path / "other")
    ensure_table(spark, lake, bronze.TABLE)
    ensure_table(spark, lake, bronze.TABLE)
    assert created == [str(lake.root)]  # the second call found it ensured

    shutil.rmtree(bronze.TABLE.path(lake))
    ensure_table(spark, lake, bronze.TABLE)
    assert delta_reader.latest_version(bronze.TABLE.path(lake)) == 0  # created again

    # The name follows the root last ensured, there and back.
    ensure_table(spark, other, bronze.TABLE)
    ensure_table(spark, lake, bronze.TABLE)
    assert created == [str(lake.root), str(lake.root), str(other.root), str(lake.root)]
    location = spark.sql("DESCRIBE DETAIL bronze.ad_events").first().location
    assert location.rstrip("/").endswith(bronze.TABLE.path(lake).lstrip("/"))


def test_a_creation_killed_before_its_first_commit_does_not_block_the_table(
        spark, tmp_path) -> None:
    # A driver SIGKILLed between making the log folder and renaming commit 0 into place
    # leaves what Delta 4.4 writes first: _delta_log/_staged_commits/ and the hidden
    # temporary commit with its checksum. Delta calls that a missing table it will not
    # create (the chaos battery wedged ops.stream_progress so, twice: every later process
    # failed to start its streams or its maintenance).
    settings = make_settings(tmp_path / "lake")
    torn = Path(bronze.TABLE.path(settings)) / "_delta_log"
    (torn / "_staged_commits").mkdir(parents=True)
    for name in (".00000000000000000000.json.0b5e.tmp", "..00000000000000000000.json.0b5e.tmp.crc"):
        (torn / name).write_text("{")
    killed_an_hour_ago = time.time() - 3600
    for made in (*torn.iterdir(), torn):
        os.utime(made, (killed_an_hour_ago, killed_an_hour_ago))
    ensure_table(spark, settings, bronze.TABLE)
    assert delta_reader.latest_version(bronze.TABLE.path(settings)) == 0


def test_a_creation_killed_a_moment_ago_is_cleared_once_it_is_old_enough(
        spark, tmp_path, monkeypatch) -> None:
    # The next driver starts right after the kill (as the chaos battery and the supervisor
    # start it): it waits until the torn log is old enough to be no creation under way, then
    # creates the table, instead of failing. (Shortened here from 30 s to 7 s, still longer
    # than the creation's own retries, 5 s.)
    monkeypatch.setattr(tables, "TORN_AFTER_SECONDS", 7)
    settings = make_settings(tmp_path / "lake")
    torn = Path(bronze.TABLE.path(settings)) / "_delta_log"
    (torn / "_staged_commits").mkdir(parents=True)
    started = time.monotonic()
    ensure_table(spark, settings, bronze.TABLE)
    assert delta_reader.latest_version(bronze.TABLE.path(settings)) == 0
    assert time.monotonic() - started >= 7 - 1  # it did wait for the age


def test_a_creation_under_way_or_a_table_is_never_taken_for_a_torn_one(tmp_path) -> None:
    log = tmp_path / "table" / "_delta_log"
    (log / "_staged_commits").mkdir(parents=True)
    # Folders made a moment ago, no commit yet: another job may be creating the table now.
    assert not tables._remove_torn_log(str(tmp_path / "table"))
    # A temporary commit written a moment ago, in folders made long ago: the same.
    (log / ".00000000000000000000.json.77aa.tmp").write_text("{")
    for folder in (log, log / "_staged_commits"):
        os.utime(folder, (0, 0))
    assert not tables._remove_torn_log(str(tmp_path / "table"))
    assert (log / ".00000000000000000000.json.77aa.tmp").exists()
    # A commit, however old the rest: a table, left alone.
    (log / ".00000000000000000000.json.77aa.tmp").unlink()
    (log / "00000000000000000000.json").write_text("{}")
    for made in (*log.iterdir(), log):
        os.utime(made, (0, 0))
    assert not tables._remove_torn_log(str(tmp_path / "table"))
    assert (log / "00000000000000000000.json").exists()
    # The same log without its commit is torn, and goes.
    (log / "00000000000000000000.json").unlink()
    os.utime(log, (0, 0))
    assert tables._remove_torn_log(str(tmp_path / "table"))
    assert not log.exists()


def test_nullability_lives_in_the_schema_which_delta_enforces_on_every_write(
        spark, tmp_path) -> None:
    # Every table's NOT NULL columns are its schema's, and Delta checks each of them on every
    # write: a row with a value in every column but one NULL is refused, naming that column.
    # So no suite checks them a second time.
    value_of = {"StringType": "x", "LongType": 0, "IntegerType": 0, "DoubleType": 0.0,
                "BooleanType": False, "DateType": date(2026, 1, 1),
                "TimestampType": datetime(2026, 1, 1), "DecimalType": Decimal(0),
                "ArrayType": ["x"]}  # gold.user_sessions' campaigns: strings
    settings = make_settings(tmp_path / "lake")
    for spec in TABLES.values():
        fields = spec.schema.fields
        required = [field.name for field in fields if not field.nullable]
        if not required:
            continue
        ensure_table(spark, settings, spec)
        loose = StructType([StructField(f.name, f.dataType, True) for f in fields])
        full = {f.name: value_of[type(f.dataType).__name__] for f in fields}
        rows = spark.createDataFrame([tuple(None if f.name == name else full[f.name]
                                            for f in fields) for name in required], loose)
        for name in required:
            with pytest.raises(Exception, match=f"NOT NULL constraint violated for column: "
                                                f"{name}\\."):
                (rows.where(F.col(name).isNull()).write.format("delta").mode("append")
                    .save(spec.path(settings)))
    for suite in (PROJECT_DIR / "expectations").glob("*.json"):
        kinds = {e["type"] for e in json.loads(suite.read_text())["expectations"]}
        assert "expect_column_values_to_not_be_null" not in kinds, suite.name
