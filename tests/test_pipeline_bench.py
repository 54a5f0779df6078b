"""The pipeline bench's arithmetic and command line (no Spark)."""

import subprocess
import sys

from spark_jobs.pipeline_bench import _covered_seconds


def test_a_layer_s_time_counts_side_by_side_batches_once() -> None:
    # Gold's two queries from 0 to 10 s and 4 to 12 s, then a batch from 20 to 21 s:
    # something ran during 0-12 and 20-21, 13 s, not the 19 s the durations add up to.
    assert _covered_seconds([(4.0, 12.0), (0.0, 10.0), (20.0, 21.0)]) == 13.0
    # One batch inside another adds nothing; one query's batches in turn add up.
    assert _covered_seconds([(0.0, 10.0), (2.0, 3.0)]) == 10.0
    assert _covered_seconds([(0.0, 2.0), (2.0, 5.0)]) == 5.0
    assert _covered_seconds([]) == 0.0


def test_make_bench_explains_itself_and_refuses_an_unknown_part() -> None:
    # Both exit before any Spark: --help (a percent sign in a help text once crashed it,
    # argparse reads it as a format) and a part the bench does not have.
    def bench(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "spark_jobs.bench", *args],
                              capture_output=True, text=True, timeout=60)

    helped = bench("--help")
    assert helped.returncode == 0, helped.stderr
    assert "% of the pipeline's backlog rate" in helped.stdout
    refused = bench("--parts", "pipeline,speed")
    assert refused.returncode == 2 and "unknown part(s) speed" in refused.stderr
