"""The gold growth benchmark's synthetic history is a Delta log that Spark reads as the
streams would have left it: one commit per earlier batch, Delta's own statistics, a
checkpoint at the end."""

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from spark_jobs.gold import ad_attribution, campaign_stats
from spark_jobs.gold_growth_bench import ROWS_PER_HISTORY_FILE, _batch_over, _last_batch_read, grow
from spark_jobs.silver import ad_events as silver
from spark_jobs.tables import ensure_table

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _history(spark, path: str) -> list:
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()


def test_each_earlier_batch_is_a_commit_of_one_file_with_delta_s_statistics(spark,
                                                                          settings) -> None:
    for table in (silver.TABLE, campaign_stats.TABLE, ad_attribution.TABLE):
        ensure_table(spark, settings, table)
    appended = ad_attribution.TABLE.path(settings)
    rewritten = campaign_stats.TABLE.path(settings)
    not_a_change = silver.TABLE.path(settings)
    firsts = {}
    for path, table, data_change, rewrites in (
            (appended, ad_attribution.TABLE, True, False),
            (rewritten, campaign_stats.TABLE, True, True),
            (not_a_change, silver.TABLE, False, False)):
        firsts[path] = len(_history(spark, path))  # the first history commit's version
        assert grow(spark, settings, table, 12, data_change=data_change, rewrites=rewrites,
                    now=NOW) == firsts[path] + 11
        # Twelve commits after the table's own: one per earlier batch; then a checkpoint.
        assert len(_history(spark, path)) == firsts[path] + 12
        last = json.loads((Path(path) / "_delta_log" / "_last_checkpoint").read_text())
        assert last["version"] == firsts[path] + 11
    # Appended: every file's rows are there. Rewritten: each commit removed the file the
    # one before added, so only the last one's rows remain.
    assert spark.read.format("delta").load(appended).count() == 12 * ROWS_PER_HISTORY_FILE
    assert spark.read.format("delta").load(rewritten).count() == ROWS_PER_HISTORY_FILE
    # Silver's history holds rows, but a stream reading its changes finds none: those
    # commits are marked as changing no data, as an OPTIMIZE's are.
    assert spark.read.format("delta").load(not_a_change).count() == 12 * ROWS_PER_HISTORY_FILE
    read_on = (spark.readStream.format("delta").option("startingVersion", firsts[not_a_change])
               .load(not_a_change).writeStream.format("memory").queryName("history_changes")
               .trigger(availableNow=True).start())
    read_on.awaitTermination()
    assert spark.table("history_changes").count() == 0
    first_add = json.loads(next(
        line for line in (Path(not_a_change) / "_delta_log"
                          / f"{firsts[not_a_change]:020d}.json").read_text().splitlines()
        if line.startswith('{"add"')))["add"]
    assert first_add["dataChange"] is False
    # Delta computed each file's statistics (the data skipping a MERGE relies on).
    stats = json.loads(first_add["stats"])
    assert stats["numRecords"] == ROWS_PER_HISTORY_FILE and "event_time" in stats["minValues"]


def test_the_history_is_committed_in_time_order_a_file_a_moment(spark, settings) -> None:
    """Files are written many to a task, so their commits must be put back in the order
    the rows were written: one moment per file, later with each commit, across dates
    (silver's history spans 30 days, a partition folder each)."""
    ensure_table(spark, settings, silver.TABLE)
    path = silver.TABLE.path(settings)
    first = len(_history(spark, path))
    # 40 commits over 30 days: dates with one file and dates with two.
    last = grow(spark, settings, silver.TABLE, 40, data_change=False, rewrites=False, now=NOW)
    moments = []
    for version in range(first, last + 1):
        entry = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text()
        stats = json.loads(next(json.loads(line)["add"]["stats"] for line in entry.splitlines()
                                if line.startswith('{"add"')))
        assert stats["numRecords"] == ROWS_PER_HISTORY_FILE
        assert stats["minValues"]["event_time"] == stats["maxValues"]["event_time"]
        moments.append(stats["minValues"]["event_time"])
    # ISO times of one zone order as text; strictly later with each commit.
    assert moments == sorted(set(moments)) and len(moments) == 40


def test_a_round_waits_for_the_batch_after_the_last_that_read_rows() -> None:
    # Spark's progress of an idle stream carries the id its next batch will run under:
    # batch 3 read rows, then the stream idled (progress "4", no rows), then batch 4 read
    # the round's append. Taking the idle progress's 4 as the last batch, the round waited
    # for a batch 5 that never came (make bench's gold growth part, cut at 600 s).
    ran = [{"batchId": 3, "numInputRows": 2000}, {"batchId": 4, "numInputRows": 0}]
    stream = SimpleNamespace(recentProgress=ran)
    before_the_round = _last_batch_read(stream)
    assert before_the_round == 3
    assert _batch_over(stream, before_the_round) is None  # nothing read since
    ran.append({"batchId": 4, "numInputRows": 2000})
    assert _batch_over(stream, before_the_round) == ran[-1]
    assert _last_batch_read(SimpleNamespace(recentProgress=[])) == -1  # before any batch
