"""A corpus with every kind of mess through bronze and silver, with a crash in the middle."""

import json
import os
import signal
from pathlib import Path

import pytest

from spark_jobs.silver import ad_events as silver
from tests.conftest import make_settings
from tests.processes import generate, run_lakehouse, start_stream, wait_for_commits

pytestmark = pytest.mark.integration


def test_killed_mid_stream_then_restarted_silver_matches_the_generator(tmp_path) -> None:
    root = tmp_path / "lake"
    # Every kind of mess well represented, spread over 24 files.
    generate(root, "--events", "12000", "--events-per-file", "500", "--seed", "21",
             "--malformed", "0.03", "--missing-field", "0.03", "--bad-time", "0.02",
             "--future-time", "0.01", "--unknown-type", "0.01", "--bad-price", "0.02",
             "--duplicate", "0.08", "--late", "0.05", "--long-line", "0.001")
    silver_table = Path(silver.TABLE.path(make_settings(root)))

    stream = start_stream(root, "bronze,silver", "--trigger", "1s")
    wait_for_commits(silver_table, 4, stream)  # table creation + a few MERGEs
    os.killpg(stream.pid, signal.SIGKILL)
    stream.wait(timeout=60)

    restarted = start_stream(root, "bronze,silver", "--available-now", files_per_batch=20)
    assert restarted.wait(timeout=400) == 0, restarted.log()[-3000:]

    audit = run_lakehouse("audit", "--root", str(root), "--json", "--expected")
    accounting = json.loads(audit.stdout)
    assert audit.returncode == 0, json.dumps(accounting, indent=1)
    assert accounting["identity_holds"] and accounting["expected"]["matches"]
    assert accounting["silver_rows"] == accounting["silver_distinct_event_ids"]
    assert accounting["duplicates"] > 0 and len(accounting["quarantine_by_reason"]) >= 12
