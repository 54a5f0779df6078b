"""Real Airflow: the DagBag, `airflow dags test` submitting real Spark jobs, and the
supervision parts (leases, graceful stop, health verdict)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spark_jobs import audit, delta_reader, registry
from spark_jobs.airflow_env import environment
from spark_jobs.config import PROJECT_DIR
from spark_jobs.ops import heartbeat
from spark_jobs.services import postgres_url
from tests.conftest import cli_env, lakehouse_command, make_settings
from tests.processes import free_port, generate, run_lakehouse, start_stream, wait_for

pytestmark = pytest.mark.integration

DAG_IDS = {"lakehouse_streaming", "lakehouse_reprocess", "lakehouse_maintenance",
           "lakehouse_quality"}

DAGBAG_REPORT = """
import json, sys
from unittest import mock
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
from airflow.timetables.base import DagRunInfo
from pendulum import parse

bag = DagBag()


def first_run_after(served, now, last=None):
    # The next automated run the scheduler creates at ``now`` (the first one when the DAG
    # is unpaused, or after the automated run ``last``): its own call on the DAG as it
    # reads it from the database (``served``).
    with mock.patch("airflow.timetables.trigger.utcnow", return_value=parse(now)), \\
            mock.patch("airflow.timetables.interval.utcnow", return_value=parse(now)):
        info = served.next_dagrun_info(last_automated_run_info=last and DagRunInfo.interval(
            *map(parse, last)))
    return info and info.run_after.isoformat()


served = {dag_id: DagSerialization.from_dict(json.loads(json.dumps(
    DagSerialization.to_dict(dag)))) for dag_id, dag in bag.dags.items()}
unpaused_at = json.loads(sys.argv[1])
print(json.dumps({
    "errors": {path: str(error) for path, error in bag.import_errors.items()},
    "parse_seconds": {s.file: s.duration.total_seconds() for s in bag.dagbag_stats},
    "heavy_imports": sorted(m for m in ("pyspark", "great_expectations", "delta",
                                        "matplotlib", "deltalake") if m in sys.modules),
    "dags": {dag_id: {
        "tags": sorted(dag.tags), "doc_md": bool(dag.doc_md), "catchup": dag.catchup,
        "max_active_runs": dag.max_active_runs,
        "first_run_after": {now: first_run_after(served[dag_id], now) for now in unpaused_at},
        # After a backfill of 22 November (a backfill's runs count as automated).
        "after_backfill": {now: first_run_after(served[dag_id], now, ("2026-11-22",
                                                                     "2026-11-23"))
                           for now in unpaused_at},
        "tasks": {task.task_id: {"retries": task.retries,
                                 "timeout": bool(task.execution_timeout),
                                 "max_active_tis_per_dag": task.max_active_tis_per_dag,
                                 "outlets": [asset.name for asset in task.outlets]}
                  for task in dag.tasks},
        "updated_by": sorted(asset.name for asset in getattr(
            getattr(dag.timetable, "asset_condition", None), "objects", ()))}
        for dag_id, dag in bag.dags.items()}}))
"""


# Lakes whose Airflow runs on the PostgreSQL of their own services, and its port.
ON_POSTGRES: dict[Path, int] = {}


def airflow(root, *args: str, timeout: int = 600, **extra: str):
    database = ({"airflow_database": "postgres", "postgres_port": ON_POSTGRES[root]}
                if root in ON_POSTGRES else {})
    env = environment(make_settings(root, **database), cli_env(**extra))
    return subprocess.run(lakehouse_command("airflow", "--root", str(root), *args), env=env,
                          capture_output=True, text=True, timeout=timeout)


# Moments at which a DAG gets unpaused: just after midnight, just after the nightly
# maintenance's 02:30 and just after an hour.
UNPAUSED_AT = ["2026-11-26T00:03:00+00:00", "2026-11-26T02:33:00+00:00",
               "2026-11-26T14:01:00+00:00"]


def dagbag_report(root, **extra: str) -> dict:
    env = environment(make_settings(root), cli_env(**extra))
    done = subprocess.run([sys.executable, "-c", DAGBAG_REPORT, json.dumps(UNPAUSED_AT)],
                          env=env, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# Each DAG's default_args: a Spark job that fails transiently is tried again.
RETRIES = {"lakehouse_streaming": 2, "lakehouse_reprocess": 1, "lakehouse_quality": 1,
           "lakehouse_maintenance": 2}


@pytest.mark.parametrize("mode", ["continuous", "scheduled"])
def test_every_dag_parses_with_retries_timeouts_tags_and_docs(tmp_path, mode) -> None:
    # Parsed where neither the jar cache nor the data root exists, as on a DAG processor
    # of its own: a task resolves its Spark settings where it runs (issue 18).
    report = dagbag_report(tmp_path / "lake", LAKEHOUSE_STREAMING_MODE=mode,
                           LAKEHOUSE_JARS_DIR=str(tmp_path / "no-jars"))
    assert report["errors"] == {}
    assert not (tmp_path / "no-jars").exists()
    assert not {"tables", "landing", "checkpoints"} & {p.name for p in tmp_path.glob("lake/*")}
    assert set(report["dags"]) >= DAG_IDS
    # DAG files are wiring: no Spark, Great Expectations or plotting at parse time, and a
    # parse far below the processor's timeout (the first file pays Airflow's own imports).
    assert report["heavy_imports"] == []
    assert max(report["parse_seconds"].values()) < 1.0, report["parse_seconds"]
    for dag_id, dag in report["dags"].items():
        assert "lakehouse" in dag["tags"] and dag["doc_md"] and dag["catchup"] is False, dag_id
        for task_id, task in dag["tasks"].items():
            # The sensor fails its run for good (the schedule starts a fresh one).
            expected = 0 if task_id == "watch_health" else RETRIES[dag_id]
            assert task["retries"] == expected and task["timeout"], f"{dag_id}.{task_id}"
    streaming_tasks = set(report["dags"]["lakehouse_streaming"]["tasks"])
    # Continuous mode is supervised by the health sensor; scheduled mode needs none.
    assert streaming_tasks == ({"run_streams", "watch_health"} if mode == "continuous"
                               else {"run_streams"})
    # One streaming driver, one validation and one maintenance at a time; and at most
    # reprocess_parallel_days rebuilds (2 on the embedded default), backfills included.
    assert {dag_id: dag["max_active_runs"] for dag_id, dag in report["dags"].items()} == {
        "lakehouse_streaming": 1, "lakehouse_quality": 1, "lakehouse_maintenance": 1,
        "lakehouse_reprocess": 2}
    assert rebuilds_at_once(report) == {"replay_quarantine": 2, "rebuild_dates": 2}
    # The assets each producer updates, and those that start a validation, are the
    # registry's published tables (test_registry names them).
    tasks = {dag_id: dag["tasks"] for dag_id, dag in report["dags"].items()}
    assert tasks["lakehouse_streaming"]["run_streams"]["outlets"] == list(registry.published())
    rebuilt = list(registry.published(registry.REPROCESSED_LAYERS))
    assert tasks["lakehouse_reprocess"]["rebuild_dates"]["outlets"] == rebuilt
    assert report["dags"]["lakehouse_quality"]["updated_by"] == sorted(rebuilt)


def test_periodic_dags_wait_for_their_time_when_unpaused(tmp_path) -> None:
    """The first unpause (``make run`` does it at start-up on a fresh Airflow database)
    must not start a maintenance, validation or rebuild run for a time missed beside the
    streams' own start: each waits for its next scheduled time; a nightly rebuild still
    starts within two hours of its midnight, and not after a backfill of earlier days."""
    dags = dagbag_report(tmp_path / "lake")["dags"]
    first = {dag_id: dag["first_run_after"] for dag_id, dag in dags.items()}
    assert first["lakehouse_maintenance"] == {
        # 02:30 had just passed at 02:33, so the next is tomorrow's.
        UNPAUSED_AT[0]: "2026-11-26T02:30:00+00:00",
        UNPAUSED_AT[1]: "2026-11-27T02:30:00+00:00",
        UNPAUSED_AT[2]: "2026-11-27T02:30:00+00:00"}
    assert first["lakehouse_quality"] == {
        UNPAUSED_AT[0]: "2026-11-26T01:00:00+00:00",
        UNPAUSED_AT[1]: "2026-11-26T03:00:00+00:00",
        UNPAUSED_AT[2]: "2026-11-26T15:00:00+00:00"}
    # The rebuild of 25 November may start at 00:03, within two hours of the midnight that
    # ends it; at 02:33 and 14:01 that night is over, and the next is 26 November's.
    nightly = {UNPAUSED_AT[0]: "2026-11-26T00:00:00+00:00",
               UNPAUSED_AT[1]: "2026-11-27T00:00:00+00:00",
               UNPAUSED_AT[2]: "2026-11-27T00:00:00+00:00"}
    assert first["lakehouse_reprocess"] == nightly
    # A backfill of earlier days does not make a night long over due either.
    assert dags["lakehouse_reprocess"]["after_backfill"] == nightly


def rebuilds_at_once(report: dict) -> dict[str, int]:
    """A backfill's runs obey the backfill's own max_active_runs, not the DAG's: the
    Spark tasks' own bound is what holds for them."""
    tasks = report["dags"]["lakehouse_reprocess"]["tasks"]
    return {task_id: task["max_active_tis_per_dag"] for task_id, task in tasks.items()
            if task["max_active_tis_per_dag"] is not None}


def test_how_many_days_rebuild_at_once_is_configuration(tmp_path) -> None:
    report = dagbag_report(tmp_path / "lake", LAKEHOUSE_REPROCESS_PARALLEL_DAYS="6")
    assert report["dags"]["lakehouse_reprocess"]["max_active_runs"] == 6
    assert rebuilds_at_once(report) == {"replay_quarantine": 6, "rebuild_dates": 6}


def test_a_job_ships_code_and_binds_for_the_master_its_connection_names(tmp_path,
                                                                         monkeypatch) -> None:
    from lakehouse_airflow.jobs import lakehouse_job

    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path / "lake"))
    # The settings say local mode; the user's connection (set apart from them, as Airflow's
    # connections are) names a cluster on this machine: the code goes along as --py-files,
    # and the driver listens where the cluster's executors reach it.
    monkeypatch.delenv("LAKEHOUSE_SPARK_MASTER", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_SPARK", json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077}))
    to_cluster = lakehouse_job("to_cluster", "validate")
    to_cluster.resolve()
    assert to_cluster.py_files and to_cluster.py_files.endswith(".zip")
    assert to_cluster.conf["spark.driver.host"] == "127.0.0.1"
    # The other way: the settings name a remote cluster, the connection local mode: nothing
    # to ship, and the driver stays on loopback.
    monkeypatch.setenv("LAKEHOUSE_SPARK_MASTER", "spark://10.0.0.5:7077")
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_SPARK", json.dumps(
        {"conn_type": "spark", "host": "local[2]"}))
    local = lakehouse_job("local", "validate")
    local.resolve()
    assert local.py_files is None
    assert local.conf["spark.driver.host"] == "127.0.0.1"


@pytest.fixture(scope="module")
def airflow_root(request):
    """A lake whose Airflow runs on PostgreSQL, the production setting: Debian's server,
    started under the root by `lakehouse services start postgres` (the live tests run
    Airflow on the embedded SQLite)."""
    # The server runs as the postgres user when the tests run as root: its folder must be
    # reachable by that user, which pytest's private temporary folders are not.
    base = Path(tempfile.mkdtemp(prefix="lakehouse-airflow-"))
    base.chmod(0o711)
    root = base / "lake"
    port = free_port()
    env = {"LAKEHOUSE_POSTGRES_PORT": str(port)}

    def stop() -> None:  # also when a check below fails: no server outlives the module
        run_lakehouse("services", "stop", "postgres", "--root", str(root), env=env)
        shutil.rmtree(base, ignore_errors=True)

    request.addfinalizer(stop)
    started = run_lakehouse("services", "start", "postgres", "--root", str(root), env=env)
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith(f"postgres: started, postgresql://lakehouse@127.0.0.1:"
                                      f"{port}/airflow (password in "), started.stdout
    # Its password is in a file only its owner reads, never in what the command prints.
    secret = root / "services" / "postgres" / "password"
    assert secret.stat().st_mode & 0o777 == 0o600
    assert secret.read_text().strip() not in started.stdout + started.stderr
    ON_POSTGRES[root] = port
    migrated = airflow(root, "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    return root



@pytest.mark.timeout(1200)
def test_dags_run_for_real_streaming_reprocess_quality_and_maintenance(airflow_root, spark
                                                                     ) -> None:
    root = airflow_root
    # Airflow's own records are in PostgreSQL, not in a SQLite file under the root.
    assert not list(root.rglob("airflow.db"))
    generate(root, "--events", "1500", "--seed", "3")
    streamed = airflow(root, "dags", "test", "lakehouse_streaming",
                       LAKEHOUSE_STREAMING_MODE="scheduled")
    assert streamed.returncode == 0, streamed.stdout[-3000:]
    assert "state=success" in streamed.stdout + streamed.stderr
    # The submitted Spark job streamed every layer: the accounting matches the generator
    # (the audit in this process: tests/test_pipeline.py runs its command).
    settings = make_settings(root)
    audited = audit.account(spark, settings, settings.expected_counts_file)
    assert audited.identity_holds and audited.matches_expected, audit.render(audited)

    today = datetime.now(UTC).date()
    conf = json.dumps({"from": str(today - timedelta(days=7)), "to": str(today)})
    reprocessed = airflow(root, "dags", "test", "lakehouse_reprocess", "-c", conf)
    output = reprocessed.stdout + reprocessed.stderr
    assert reprocessed.returncode == 0, output[-3000:]
    assert "state=success" in output and "reprocessed" in output
    audited = audit.account(spark, settings)
    assert audited.identity_holds, audit.render(audited)

    # The periodic jobs on the same root: validation passes on this data and writes the
    # report the UI links to; maintenance records its figures for every table.
    for dag_id in ("lakehouse_quality", "lakehouse_maintenance"):
        done = airflow(root, "dags", "test", dag_id)
        output = done.stdout + done.stderr
        assert done.returncode == 0 and "state=success" in output, output[-3000:]
    assert list((root / "reports").glob("quality-*.html"))
    history = delta_reader.read_arrow(root / "tables" / "ops" / "maintenance_history").to_pandas()
    assert set(history["table_name"]) == {"bronze.ad_events", "silver.ad_events",
                                          "silver.quarantine", "gold.campaign_stats",
                                          "gold.ad_attribution", "gold.user_sessions"}

    # The stream health page of the UI plugin renders from the same tables.
    page = subprocess.run(
        [sys.executable, "-c", "from lakehouse_airflow.views import stream_health_page; "
                               "print(stream_health_page())"],
        env={**environment(make_settings(root), cli_env()),
             "PYTHONPATH": str(PROJECT_DIR / "plugins")},
        capture_output=True, text=True, timeout=120, check=True).stdout
    assert "silver_ad_events" in page and "gold_campaign_stats" in page

    # Each DAG's run is recorded in PostgreSQL.
    import psycopg2

    url = postgres_url(make_settings(root, postgres_port=ON_POSTGRES[root]),
                       driver="postgresql")
    with psycopg2.connect(url) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT dag_id, state FROM dag_run")
        runs = set(cursor.fetchall())
    assert {(dag_id, "success") for dag_id in DAG_IDS} <= runs, runs


def test_bad_params_are_refused_by_name(airflow_root) -> None:
    refused = airflow(airflow_root, "dags", "test", "lakehouse_reprocess", "-c",
                      json.dumps({"from": "21/11/2026"}))
    assert refused.returncode != 0
    assert "Invalid input for param from" in refused.stdout + refused.stderr


def test_one_driver_per_stream_and_a_graceful_stop(tmp_path) -> None:
    root = tmp_path / "lake"
    settings = make_settings(root)
    generate(root, "--events", "400", "--events-per-file", "100")
    first = start_stream(root, "bronze", "--trigger", "1s")
    beat_file = heartbeat.heartbeat_file(settings, ["bronze"])
    wait_for(beat_file.exists, "the stream never wrote a heartbeat")
    assert heartbeat.health(settings).running

    # A second driver on the same checkpoint fails fast, naming the first.
    second = subprocess.run(lakehouse_command("stream", "--root", str(root), "--layers",
                                              "bronze"),
                            env=cli_env(), capture_output=True, text=True, timeout=120)
    assert second.returncode == 1
    assert "already running under another driver" in second.stderr
    assert f'"pid": {first.pid}' in second.stderr
    # Refused before a JVM started: Spark prints its logging profile as its JVM starts.
    assert "log4j" not in second.stderr, second.stderr[-2000:]

    stop = run_lakehouse("stop", "--root", str(root), "--wait", "180")
    assert stop.returncode == 0, stop.stderr
    assert first.wait(timeout=60) == 0
    verdict = heartbeat.health(settings)
    assert verdict.stopped_cleanly and not verdict.running and not verdict.problems


def write_heartbeat(settings, *, written_at: datetime, progress_at: datetime,
                    stopped: bool = False, trigger: str = "5 seconds") -> None:
    path = heartbeat.heartbeat_file(settings, ["silver"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "pid": os.getpid(), "layers": ["silver"], "written_at": written_at.isoformat(),
        "stopped": stopped, "trigger_interval": trigger,
        "queries": {"silver_ad_events": {"last_progress_at": progress_at.isoformat(),
                                         "batch_id": 7, "active": True}}}))


def test_health_verdicts(tmp_path) -> None:
    from spark_jobs.ops.leases import leases

    settings = make_settings(tmp_path / "lake")
    now = datetime.now(UTC)
    # 24 trigger intervals of 5 s: stalled after two minutes without progress.
    assert heartbeat.stall_after(settings) == timedelta(minutes=2)
    with leases(settings, ["silver"]):
        write_heartbeat(settings, written_at=now, progress_at=now - timedelta(seconds=30))
        assert heartbeat.health(settings, now).problems == []
        write_heartbeat(settings, written_at=now, progress_at=now - timedelta(minutes=3))
        assert ["stream silver_ad_events stalled" in problem
                for problem in heartbeat.health(settings, now).problems] == [True]
        # A driver on a trigger of its own (lakehouse stream --trigger "1 minute") is given
        # 24 of its intervals: 3 minutes without progress is 3 triggers, not a stall...
        write_heartbeat(settings, written_at=now, progress_at=now - timedelta(minutes=3),
                        trigger="1 minute")
        assert heartbeat.health(settings, now).problems == []
        # ...and 25 minutes is.
        write_heartbeat(settings, written_at=now, progress_at=now - timedelta(minutes=25),
                        trigger="1 minute")
        assert ["stream silver_ad_events stalled" in problem
                for problem in heartbeat.health(settings, now).problems] == [True]
        # A quicker one keeps the configured limit: a driver is never restarted for a
        # batch that limit allows.
        write_heartbeat(settings, written_at=now, progress_at=now - timedelta(seconds=90),
                        trigger="1 second")
        assert heartbeat.health(settings, now).problems == []
    # No driver holds the lease, and it never said it stopped: it died.
    assert heartbeat.health(settings, now).problems == [
        "the driver of silver exited without a stop request"]
    write_heartbeat(settings, written_at=now, progress_at=now, stopped=True)
    assert heartbeat.health(settings, now).stopped_cleanly
