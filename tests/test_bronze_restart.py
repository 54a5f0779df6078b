"""The bronze job as a real process: stopped gracefully, killed mid-stream, restarted."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from spark_jobs.bronze import ad_events as bronze
from tests.conftest import cli_env, lakehouse_command, make_settings

pytestmark = pytest.mark.integration


def committed_versions(table: Path) -> int:
    log = table / "_delta_log"
    return len(list(log.glob("*.json"))) if log.exists() else 0


def start_stream(root: Path, *args: str, files_per_batch: int = 1) -> subprocess.Popen[bytes]:
    # One file per micro-batch by default, so there are many commits to die between (or in).
    env = cli_env(LAKEHOUSE_MAX_FILES_PER_TRIGGER=str(files_per_batch))
    return subprocess.Popen(
        lakehouse_command("stream", "--root", str(root), "--layers", "bronze", *args),
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def wait_for_commits(table: Path, at_least: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180
    while committed_versions(table) < at_least:
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        assert time.monotonic() < deadline, "the stream made no progress"
        time.sleep(0.2)


def test_sigterm_stops_cleanly_and_sigkill_loses_and_duplicates_nothing(spark, tmp_path) -> None:
    root = tmp_path / "lake"
    generated = subprocess.run(
        lakehouse_command("generate", "--root", str(root), "--events", "6000",
                          "--events-per-file", "200", "--seed", "11"),
        env=cli_env(), capture_output=True, text=True, timeout=120, check=True)
    delivered = json.loads(generated.stdout)["generated"]["delivered"]
    table = Path(bronze.TABLE.path(make_settings(root)))

    # A graceful stop: SIGTERM, exit 0, at a batch boundary.
    stream = start_stream(root, "--trigger", "1s")
    wait_for_commits(table, 4, stream)
    stream.send_signal(signal.SIGTERM)
    assert stream.wait(timeout=120) == 0

    # A crash: SIGKILL of the driver and its JVM, wherever they are.
    stream = start_stream(root, "--trigger", "1s")
    wait_for_commits(table, committed_versions(table) + 3, stream)
    os.killpg(stream.pid, signal.SIGKILL)
    stream.wait(timeout=60)
    assert committed_versions(table) < 31, "all 30 files were in before the kill: no crash test"

    # Restart and catch up; then once more, which must add nothing.
    for _ in range(2):
        restarted = start_stream(root, "--available-now", files_per_batch=20)
        assert restarted.wait(timeout=300) == 0, restarted.stderr.read().decode()
        rows = spark.read.format("delta").load(str(table))
        assert rows.count() == delivered
        assert rows.select("bronze_id").distinct().count() == delivered

    # The table by name, from a fresh process.
    query = subprocess.run(
        lakehouse_command("sql", "--root", str(root), "--json",
                          "SELECT count(*) AS n FROM bronze.ad_events"),
        env=cli_env(), capture_output=True, text=True, timeout=180)
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout.strip().splitlines()[-1]) == [{"n": delivered}]
