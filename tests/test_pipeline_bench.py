"""The pipeline bench's arithmetic and command line (no Spark)."""

import subprocess
import sys

import pytest

from spark_jobs.bench import _part, render_durations
from spark_jobs.pipeline_bench import _covered_seconds
from spark_jobs.progress import SILENT


def test_a_layer_s_time_counts_side_by_side_batches_once() -> None:
    # Gold's two queries from 0 to 10 s and 4 to 12 s, then a batch from 20 to 21 s:
    # something ran during 0-12 and 20-21, 13 s, not the 19 s the durations add up to.
    assert _covered_seconds([(4.0, 12.0), (0.0, 10.0), (20.0, 21.0)]) == 13.0
    # One batch inside another adds nothing; one query's batches in turn add up.
    assert _covered_seconds([(0.0, 10.0), (2.0, 3.0)]) == 10.0
    assert _covered_seconds([(0.0, 2.0), (2.0, 5.0)]) == 5.0
    assert _covered_seconds([]) == 0.0


def test_each_part_s_minutes_are_kept_a_failed_one_s_too() -> None:
    results: dict[str, object] = {}
    with _part(results, SILENT, "pipeline", "pipeline: ..."):
        pass
    with pytest.raises(RuntimeError), _part(results, SILENT, "feed", "feed: ..."):
        raise RuntimeError("no gold batch within 600 s")
    # Both parts are there, in the order they ran, each a duration (a part that did nothing
    # took next to no time).
    assert list(results["part_seconds"]) == ["pipeline", "feed"]
    assert all(0 <= seconds < 1 for seconds in results["part_seconds"].values())
    # 9 minutes and 18.5: 27.5 in all, the bound being 30.
    assert render_durations({"pipeline": 540.0, "feed": 1110.0}) == (
        "minutes: 27.5 in all (pipeline 9.0, feed 18.5)")


def test_make_bench_explains_itself_and_refuses_an_unknown_part() -> None:
    # Both exit before any Spark: --help (a percent sign in a help text once crashed it,
    # argparse reads it as a format) and a part the bench does not have.
    def bench(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "spark_jobs.bench", *args],
                              capture_output=True, text=True, timeout=60)

    helped = bench("--help")
    assert helped.returncode == 0, helped.stderr
    assert "% of the pipeline's backlog rate" in helped.stdout
    # By default what issue 13 asks of every run; the comparisons by name or with all.
    assert "default: pipeline,feed,growth,gold_growth" in " ".join(helped.stdout.split())
    refused = bench("--parts", "pipeline,speed")
    assert refused.returncode == 2 and "unknown part(s) speed" in refused.stderr


def test_the_declarative_comparison_counts_what_each_pipeline_got_wrong(tmp_path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    from spark_jobs.declarative_bench import _counts, render
    from spark_jobs.expected_counts import ExpectedCounts

    def table(name: str, **columns: list) -> str:
        write_deltalake(str(tmp_path / name), pa.table(columns))
        return str(tmp_path / name)

    # Five records delivered: three distinct valid events (a, b, c), one redelivery of a,
    # and one record the contract rejects (x).
    expected = ExpectedCounts(delivered=5, valid_distinct=3)
    expected.invalid_by_reason["bad_event_time"] = 1
    bronze = table("bronze", value=["a", "b", "c", "a", "x"])
    # A plain silver that kept the redelivery and the rejected record, and lost c.
    silver = table("silver", event_id=["a", "a", "b", "x"])
    gold = table("gold", views=[2, 1], clicks=[1, 0], purchases=[0, 0])
    counts = _counts(expected, {"a", "b", "c"}, bronze, silver, None, gold)
    assert counts == {
        "bronze_rows": 5, "expected_bronze_rows": 5, "silver_rows": 4,
        "expected_silver_rows": 3, "silver_duplicate_rows": 1, "silver_invalid_events": 1,
        "valid_events_missing": 1, "quarantined_rows": 0, "expected_quarantined_rows": 1,
        "gold_events_counted": 4}
    shown = render({"records": 5, "repetitions": 1, "lakehouse_speed_vs_plain": 1.5,
                    "median_seconds": {"lakehouse": 2.0, "plain": 3.0},
                    "records_per_second": {"lakehouse": 2, "plain": 1},
                    "exactness": {"lakehouse": counts, "plain": counts}})
    assert "the lakehouse at 1.5x" in shown and "valid events missing" in shown
