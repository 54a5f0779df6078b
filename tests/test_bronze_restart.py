"""The bronze job as a real process: stopped gracefully, restarted. (SIGKILLs mid-stream, of
every layer, are the chaos battery's: ``tests/test_chaos.py``.)"""

import json
import signal
from pathlib import Path

import pytest

from spark_jobs import streaming
from spark_jobs.bronze import ad_events as bronze
from tests.conftest import make_settings
from tests.processes import (
    committed_versions,
    generate,
    run_lakehouse,
    start_stream,
    wait_for_commits,
)

pytestmark = pytest.mark.integration


def test_sigterm_stops_cleanly_and_restarts_lose_and_duplicate_nothing(spark, tmp_path) -> None:
    root = tmp_path / "lake"
    delivered = generate(root, "--events", "6000", "--events-per-file", "100",
                         "--seed", "11")["delivered"]
    table = Path(bronze.TABLE.path(make_settings(root)))

    # A graceful stop: SIGTERM, exit 0, at a batch boundary.
    stream = start_stream(root, "bronze", "--trigger", "1s")
    wait_for_commits(table, 4, stream)
    stream.send_signal(signal.SIGTERM)
    assert stream.wait(timeout=120) == 0
    assert committed_versions(table) < 61, "all 60 files were in before the stop: no test"

    def assert_every_delivery_once() -> None:
        rows = spark.read.format("delta").load(str(table))
        assert rows.count() == delivered
        assert rows.select("bronze_id").distinct().count() == delivered

    # Restart and catch up; then once more, which must add nothing (in this process: a
    # start on the same checkpoint all the same, without a second JVM).
    restarted = start_stream(root, "bronze", "--available-now", files_per_batch=20)
    assert restarted.wait(timeout=300) == 0, restarted.log()
    assert_every_delivery_once()
    streaming.run_available_now(spark, make_settings(root, max_files_per_trigger=20),
                                ["bronze"])
    assert_every_delivery_once()

    # The table by name, from a fresh process.
    query = run_lakehouse("sql", "--root", str(root), "--json",
                          "SELECT count(*) AS n FROM bronze.ad_events")
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout.strip().splitlines()[-1]) == [{"n": delivered}]
