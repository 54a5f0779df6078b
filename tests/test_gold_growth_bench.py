"""The gold growth benchmark's synthetic history is a Delta log that Spark reads as the
streams would have left it: one commit per earlier batch, Delta's own statistics, a
checkpoint at the end."""

import json
from datetime import UTC, datetime
from pathlib import Path

from spark_jobs.gold import ad_attribution, campaign_stats
from spark_jobs.gold_growth_bench import ROWS_PER_HISTORY_FILE, grow
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
