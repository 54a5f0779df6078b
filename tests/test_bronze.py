import gzip
import os
import time
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import functions as F

from spark_jobs import delta_reader, streaming
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import Settings
from spark_jobs.ops import stream_progress
from spark_jobs.storage import write_atomically
from tests.conftest import make_settings


def lines_of(spark, files: dict[str, str]) -> list[tuple[str, int, str]]:
    frame = spark.createDataFrame(list(files.items()), "file_path string, value string")
    rows = bronze.lines_from_files(frame).collect()
    return sorted((row.source_file, row.source_line, row.raw) for row in rows)


def test_each_non_blank_line_becomes_one_row_with_its_position(spark) -> None:
    rows = lines_of(spark, {"a.jsonl": '{"n":1}\n\n   \n\t\f\u000b \r\n{"n":2}\n'})
    # Lines 2 to 4 are blank (nothing, spaces, other white space): not records. Positions
    # are the file's own line numbers.
    assert rows == [("a.jsonl", 1, '{"n":1}'), ("a.jsonl", 5, '{"n":2}')]


def test_bom_and_crlf_do_not_reach_the_raw_text(spark) -> None:
    # The second file is two files concatenated: its mark opens line 2.
    rows = lines_of(spark, {"b.jsonl": '\ufeff{"n":1}\r\n{"n":2}\r\n',
                            "c.jsonl": '\ufeff{"n":3}\n\ufeff{"n":4}\n'})
    assert [raw for _, _, raw in rows] == ['{"n":1}', '{"n":2}', '{"n":3}', '{"n":4}']


def test_broken_lines_are_kept_exactly(spark) -> None:
    broken = ['not json', '[1,2]', 'null', '{"a":', '{"é":"日本"}', "x" * (1024 * 1024)]
    rows = lines_of(spark, {"c.jsonl": "\n".join(broken) + "\n"})
    assert [raw for _, _, raw in rows] == broken


def test_bronze_id_names_file_and_line(spark) -> None:
    frame = spark.createDataFrame([("file:/l/x.jsonl", '{"n":1}')],
                                  "file_path string, value string")
    row = bronze.lines_from_files(frame).first()
    assert row.bronze_id == "file:file:/l/x.jsonl:1"
    assert row.source == "file" and row.ingest_date == row.ingested_at.date()


def land(settings: Settings, name: str, content: bytes) -> None:
    write_atomically(settings.landing_events, name, content)


def bronze_rows(spark, settings: Settings) -> list:
    return spark.read.format("delta").load(bronze.TABLE.path(settings)).collect()


def test_stream_lands_plain_gzip_bom_and_invalid_utf8_exactly_once(spark, settings) -> None:
    land(settings, "one.jsonl", b'\xef\xbb\xbf{"n":1}\r\n{"n":2}\r\n')
    land(settings, "two.jsonl.gz", gzip.compress(b'{"n":3}\n\n{"n":"\xff"}\n'))
    land(settings, "ignored.csv", b"n\n5\n")  # not a landing-zone file
    streaming.run_available_now(spark, settings, ["bronze"])
    rows = bronze_rows(spark, settings)
    assert sorted(row.raw for row in rows) == ['{"n":"\ufffd"}', '{"n":1}', '{"n":2}', '{"n":3}']

    # Running again with nothing new adds nothing; a new file adds only its lines.
    streaming.run_available_now(spark, settings, ["bronze"])
    assert len(bronze_rows(spark, settings)) == 4
    land(settings, "three.jsonl", b'{"n":4}\n')
    streaming.run_available_now(spark, settings, ["bronze"])
    assert len(bronze_rows(spark, settings)) == 5

    # Every micro-batch left its progress in records, not files (each file is read whole):
    # three runs, records read 4 + 0 + 1 from files 2 + 0 + 1.
    progress = spark.read.format("delta").load(stream_progress.TABLE.path(settings))
    batches = progress.where("query_name = 'bronze_ad_events'").collect()
    assert sum(row.num_input_rows for row in batches) == 5


def test_a_batch_replayed_after_its_commit_lands_once_and_keeps_its_time(spark, tmp_path
                                                                         ) -> None:
    """Killed after bronze's append committed but before Spark recorded the batch done, the
    driver replays the batch on its next start: the commit naming the batch is found in the
    table's log and the batch is not appended again. Its rows carry the batch's own time."""
    import json

    settings = make_settings(tmp_path / "lake", max_files_per_trigger=1)
    land(settings, "one.jsonl", b'{"n":1}\n{"n":2}\n')
    land(settings, "two.jsonl", b'{"n":3}\n')
    streaming.run_available_now(spark, settings, ["bronze"])  # a batch per file
    checkpoint = Path(settings.checkpoint(bronze.QUERY_NAME))
    path = bronze.TABLE.path(settings)
    # Each batch's rows carry the time Spark planned it with, kept in its offset log.
    planned = [int(json.loads((checkpoint / "offsets" / str(batch)).read_text()
                              .splitlines()[1])["batchTimestampMs"]) for batch in (0, 1)]
    stamps = {row.ingested_at.timestamp() * 1000 for row in bronze_rows(spark, settings)}
    assert stamps == set(planned) and planned[0] < planned[1]
    everything = ['{"n":1}', '{"n":2}', '{"n":3}']

    def forget_batch_1() -> None:  # the kill: batch 1 not recorded done
        for name in ("1", ".1.crc"):
            (checkpoint / "commits" / name).unlink(missing_ok=True)

    forget_batch_1()  # after its append committed
    version = delta_reader.latest_version(path)
    streaming.run_available_now(spark, settings, ["bronze"])
    assert (checkpoint / "commits" / "1").exists()  # replayed, and done this time
    assert sorted(row.raw for row in bronze_rows(spark, settings)) == everything
    assert delta_reader.latest_version(path) == version  # not appended again

    # Killed before the append committed (its data files written, the log entry not), the
    # replay appends the batch.
    forget_batch_1()
    for name in (f"{version:020d}.json", f"{version:020d}.crc"):
        for written in (name, f".{name}.crc"):  # and the local file system's checksum
            (Path(path) / "_delta_log" / written).unlink(missing_ok=True)
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # as a new driver finds it
    assert len(bronze_rows(spark, settings)) < 3
    streaming.run_available_now(spark, settings, ["bronze"])
    assert sorted(row.raw for row in bronze_rows(spark, settings)) == everything


def test_bronze_is_readable_by_another_delta_reader_and_by_name(spark, settings) -> None:
    land(settings, "one.jsonl", b'{"n":1}\n{"n":2}\n')
    streaming.run_available_now(spark, settings, ["bronze"])
    # delta-rs, a reader that shares no code with Spark's Delta.
    assert delta_reader.read_arrow(bronze.TABLE.path(settings)).num_rows == 2
    assert spark.sql("SELECT count(*) AS n FROM bronze.ad_events").first().n == 2
    assert "bronze.ad_events" in (Path(settings.root) / "catalog.sql").read_text()


def test_bronze_files_carry_no_parquet_statistics_and_filters_still_find_their_rows(
        spark, settings) -> None:
    land(settings, "one.jsonl", b'{"n":1}\n{"n":2}\n')
    streaming.run_available_now(spark, settings, ["bronze"])
    path = bronze.TABLE.path(settings)
    [data_file] = Path(path).glob("ingest_date=*/*.parquet")
    row_group = pq.ParquetFile(data_file).metadata.row_group(0)
    # No column has min and max (the table's Parquet properties): the raw text, identity
    # and file path are not compared and measured on every write. The line number would
    # have them by default (a long).
    kept = [row_group.column(i).path_in_schema for i in range(row_group.num_columns)
            if row_group.column(i).statistics is not None
            and row_group.column(i).statistics.has_min_max]
    assert kept == []
    # Delta's own statistics, which skip files by ingestion time, are still written.
    [delta_statistics] = delta_reader.file_statistics(path, ("ingested_at",))
    assert delta_statistics["min.ingested_at"] is not None
    # Without them a filter still finds exactly its rows (Spark reads every row group).
    second_line = next(row.bronze_id for row in bronze_rows(spark, settings)
                       if row.source_line == 2)
    found = spark.read.format("delta").load(path).where(F.col("bronze_id") == second_line)
    assert [row.raw for row in found.collect()] == ['{"n":2}']


def test_a_file_delivered_with_an_old_modification_time_is_still_ingested(spark, settings
                                                                          ) -> None:
    """Issue 15: a backfill copied into the landing zone with its modification times kept
    (``cp -p``, ``rsync -a``) after newer files were read. Spark's file source skipped,
    without a word, files older than ``maxFileAge`` (7 days) behind the newest it had seen."""
    land(settings, "today.jsonl", b'{"n":1}\n')
    streaming.run_available_now(spark, settings, ["bronze"])
    land(settings, "backfill-2026-10.jsonl", b'{"n":2}\n')
    a_month_ago = time.time() - 30 * 86_400
    os.utime(settings.landing_events / "backfill-2026-10.jsonl", (a_month_ago, a_month_ago))
    streaming.run_available_now(spark, settings, ["bronze"])
    assert sorted(row.raw for row in bronze_rows(spark, settings)) == ['{"n":1}', '{"n":2}']


def landed_names(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.rglob("*.jsonl"))


def test_ingested_files_leave_the_landing_zone_and_are_not_read_again(spark, settings
                                                                      ) -> None:
    """Spark's file source lists the whole landing folder every trigger (beside 50,000 kept
    files a trigger took 1.16 s, 0.43 s with them archived): a file bronze has committed is
    archived, so the folder holds only what is still to be read. Spark cleans a batch's
    files when the stream plans its next batch, so the last one's stay until then."""
    for number, name in enumerate(("one.jsonl", "two.jsonl", "three.jsonl"), start=1):
        land(settings, name, f'{{"n":{number}}}\n'.encode())
        streaming.run_available_now(spark, settings, ["bronze"])
    assert sorted(row.raw for row in bronze_rows(spark, settings)) == [
        '{"n":1}', '{"n":2}', '{"n":3}']
    assert landed_names(settings.landing_events) == ["three.jsonl"]
    archived = list(settings.landing_archive.rglob("*.jsonl"))
    assert sorted(path.name for path in archived) == ["one.jsonl", "two.jsonl"]
    # Each under its own path, so files of the same name from other folders do not meet.
    assert all(str(settings.landing_events).lstrip("/") in str(path) for path in archived)

    # Archived files are not read again, nor is the one left for the next plan.
    streaming.run_available_now(spark, settings, ["bronze"])
    assert len(bronze_rows(spark, settings)) == 3


def test_ingested_files_can_be_deleted_or_left(spark, tmp_path) -> None:
    for cleanup, left in (("delete", ["two.jsonl"]), ("off", ["one.jsonl", "two.jsonl"])):
        settings = make_settings(tmp_path / cleanup, landing_cleanup=cleanup)
        for name in ("one.jsonl", "two.jsonl"):
            land(settings, name, b'{"n":1}\n')
            streaming.run_available_now(spark, settings, ["bronze"])
        assert landed_names(settings.landing_events) == left
        assert landed_names(settings.landing_archive) == []
        assert len(bronze_rows(spark, settings)) == 2


def test_a_start_sweeps_out_files_read_before_but_left_behind(spark, tmp_path) -> None:
    """Spark cleans at best effort (a driver killed before its cleaner ran, a lake that
    ingested before cleaning was on): a stream's start moves out every file its source read
    in a committed batch, from the source's own log."""
    kept = make_settings(tmp_path / "lake", landing_cleanup="off")
    for name in ("a.jsonl", "b.jsonl"):
        land(kept, name, b'{"n":1}\n')
        streaming.run_available_now(spark, kept, ["bronze"])
    archiving = kept.replace(landing_cleanup="archive")
    land(archiving, "c.jsonl", b'{"n":2}\n')
    streaming.run_available_now(spark, archiving, ["bronze"])
    # a swept at the start; b, the last committed batch's, cleaned by Spark as it planned
    # this run's batch; c read by this run, cleaned when a later batch is planned.
    assert landed_names(archiving.landing_events) == ["c.jsonl"]
    assert landed_names(archiving.landing_archive) == ["a.jsonl", "b.jsonl"]
    assert len(bronze_rows(spark, archiving)) == 3


def test_a_name_delivered_again_is_neither_read_nor_swept(spark, tmp_path) -> None:
    settings = make_settings(tmp_path / "lake", landing_cleanup="delete")
    for name in ("a.jsonl", "b.jsonl"):
        land(settings, name, b'{"n":1}\n')
        streaming.run_available_now(spark, settings, ["bronze"])
    assert landed_names(settings.landing_events) == ["b.jsonl"]  # a deleted by Spark
    time.sleep(0.01)  # another modification time, as a real second delivery has
    land(settings, "a.jsonl", b'{"n":"new data under an old name"}\n')
    streaming.run_available_now(spark, settings, ["bronze"])
    # The source remembers a.jsonl: not read again, nor swept (its modification time is not
    # the one read), so an operator can still find it and deliver it under a new name. b is
    # the last committed batch's, which Spark cleans when it plans the next batch.
    assert landed_names(settings.landing_events) == ["a.jsonl", "b.jsonl"]
    assert len(bronze_rows(spark, settings)) == 2


def test_the_sweep_reads_the_source_log_from_its_last_compaction(tmp_path) -> None:
    """The file source's log as Spark writes it: a compaction every tenth offset holding
    every entry before it, then an entry file per offset, paths as percent-encoded URIs."""
    from spark_jobs.landing import _read_by_source

    log = tmp_path / "sources" / "0"
    log.mkdir(parents=True)

    def entry(name: str, batch: int) -> str:
        return (f'{{"path":"file:///lake/landing/events/{name}","timestamp":{1000 + batch},'
                f'"batchId":{batch}}}\n')

    (log / "8").write_text("v1\n" + entry("stale.jsonl", 8))  # before the compaction
    (log / "9.compact").write_text("v1\n" + entry("a%20b.jsonl", 3) + entry("c.jsonl", 9))
    (log / "10").write_text("v1\n" + entry("d.jsonl", 10))
    (log / "11").write_text("v1\n" + entry("e.jsonl", 11))
    (log / ".11.crc").write_text("not a log")
    wanted = {"a b.jsonl", "c.jsonl", "d.jsonl", "e.jsonl", "stale.jsonl"}
    # Offsets before 11 (the last committed batch's, Spark's to clean); 8 is read from the
    # compaction only, where it is not (the file is there only to be skipped).
    assert _read_by_source(log, wanted, before_offset=11) == {
        "/lake/landing/events/a b.jsonl": 1003, "/lake/landing/events/c.jsonl": 1009,
        "/lake/landing/events/d.jsonl": 1010}
    assert _read_by_source(log, {"c.jsonl"}, before_offset=11) == {
        "/lake/landing/events/c.jsonl": 1009}


# -- Kafka ----------------------------------------------------------------------------------

KAFKA_MESSAGES = ("key binary, value binary, topic string, partition int, offset long, "
                  "timestamp timestamp, timestampType int")


TOPIC_ID = "u6Wl5fjgQkSH1pTvXg3kVw"  # as Kafka shows a topic's id


def kafka_rows(spark, values: list[bytes | None]) -> list:
    from datetime import UTC, datetime

    messages = spark.createDataFrame(
        [(None, value, "ad-events", 1, 40 + index, datetime.now(UTC), 0)
         for index, value in enumerate(values)], KAFKA_MESSAGES)
    return sorted(bronze.records_from_kafka(messages, TOPIC_ID).collect(),
                  key=lambda row: row.kafka_offset)


def test_each_kafka_message_is_one_bronze_row_named_by_topic_partition_and_offset(spark) -> None:
    rows = kafka_rows(spark, [b'{"n":1}', b"\xef\xbb\xbf{\"n\":2}", b"", None, b'{"n":"\xff"}'])
    # Five messages, five rows: an empty and a null message are records too (a topic has
    # no blank lines; silver quarantines them), so nothing is dropped at the door.
    # The topic is named with the id the broker made it under (a topic made again under
    # its name starts at offset 0 again), then partition and offset.
    assert [row.bronze_id for row in rows] == [f"kafka:ad-events@{TOPIC_ID}:1:{offset}"
                                               for offset in range(40, 45)]
    # The mark belongs to the encoding; a byte that is not UTF-8 becomes U+FFFD as the
    # landing zone's reader makes it, which silver's invalid_encoding rule looks for.
    assert [row.raw for row in rows] == ['{"n":1}', '{"n":2}', "", "", '{"n":"\ufffd"}']
    assert {(row.source, row.source_file, row.source_line, row.kafka_topic,
             row.kafka_partition) for row in rows} == {("kafka", None, None, "ad-events", 1)}


def test_kafka_records_take_the_same_quarantine_paths_as_lines(spark) -> None:
    from spark_jobs.silver.validation import Rules, validate

    rows = bronze.records_from_kafka(spark.createDataFrame(
        [(None, value, "t", 0, offset, None, 0) for offset, value in
         enumerate([b"", None, b'{"event_id":"\xff"}', b"[1]"])], KAFKA_MESSAGES), TOPIC_ID)
    rules = Rules.from_settings(make_settings(Path("unused")))
    reasons = sorted(row.reason for row in validate(rows, rules).collect())
    # Empty and null values are not JSON; the invalid byte is an encoding fault; the array
    # is JSON but not an object: each with the reason a file's line would get.
    assert reasons == ["invalid_encoding", "malformed_json", "malformed_json", "not_an_object"]


# Spark's own words when a stream finds its next Kafka offsets gone (seen in a run against
# the real broker: records deleted while the stream was down), and when it plans a batch.
SPARK_DATA_LOSS = """\
org.apache.spark.sql.kafka010.KafkaIllegalStateException: Some data may have been lost \
because they are not available in Kafka any more;
Reason: Could not read records in offset [1550, 1823) for topic partition ad-events-0
"""
SPARK_START_RESET = ("[KAFKA_DATA_LOSS.START_OFFSET_RESET] Some data may have been lost "
                     "... Starting offset for ad-events-1 was 20 but it is 35 now.")


def test_a_kafka_data_loss_failure_names_the_lost_offsets_and_the_way_on() -> None:
    explained = bronze.explain_failure(SPARK_DATA_LOSS)
    # [1550, 1823) excludes its end: the last lost offset is 1822.
    assert explained is not None and "ad-events-0 offsets 1550 to 1822" in explained
    assert "LAKEHOUSE_KAFKA_FAIL_ON_DATA_LOSS=false" in explained
    assert "ad-events-1 offsets 20 to 34" in (bronze.explain_failure(SPARK_START_RESET) or "")
    # Any other failure is left to the generic message.
    assert bronze.explain_failure("java.lang.OutOfMemoryError: Java heap space") is None
