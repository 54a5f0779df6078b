import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs import config
from spark_jobs.airflow_env import environment
from spark_jobs.config import ConfigError
from spark_jobs.session import spark_conf
from tests.conftest import cli_env


def test_defaults_come_from_the_checked_in_file(tmp_path: Path) -> None:
    settings = config.load(environ={})
    # The values of spark_jobs/defaults.toml.
    assert settings.source == "files"
    assert settings.watermark_delay == "10 minutes"
    assert settings.derive_missing_event_id is False
    assert settings.root == Path("data").resolve()
    # The driver's ports on loopback with a local master; reachable by a cluster's executors.
    assert spark_conf(settings)["spark.driver.bindAddress"] == "127.0.0.1"
    assert "spark.driver.host" not in spark_conf(settings.replace(spark_master="spark://m:7077"))
    # Validation's generated code is JIT-compiled; an empty setting leaves the JVM options
    # to spark-defaults.conf (the driver's also map the class archive once it is built:
    # tests/test_class_archive.py).
    conf = spark_conf(settings)
    assert conf["spark.executor.extraJavaOptions"] == "-XX:-DontCompileHugeMethods"
    assert conf["spark.driver.extraJavaOptions"].startswith("-XX:-DontCompileHugeMethods")
    assert not {key for key in spark_conf(settings.replace(spark_java_options=""))
                if key.endswith("JavaOptions")}
    # Every driver's heap, a stream's or a batch job's, from one setting.
    assert conf["spark.driver.memory"] == "3g"
    assert spark_conf(config.load(environ={"LAKEHOUSE_SPARK_DRIVER_MEMORY": "4096m"})
                      )["spark.driver.memory"] == "4096m"
    # Delta rebuilds a table version's state in one partition, unless a bigger lake asks.
    assert conf["spark.databricks.delta.snapshotPartitions"] == "1"
    assert spark_conf(config.load(environ={"LAKEHOUSE_DELTA_SNAPSHOT_PARTITIONS": "16"})
                      )["spark.databricks.delta.snapshotPartitions"] == "16"


def test_environment_overrides_file_and_flags_override_environment(tmp_path: Path) -> None:
    env = {"LAKEHOUSE_ROOT": str(tmp_path / "env"), "LAKEHOUSE_SHUFFLE_PARTITIONS": "7",
           "LAKEHOUSE_DERIVE_MISSING_EVENT_ID": "yes"}
    settings = config.load({"root": tmp_path / "flag"}, environ=env)
    assert settings.root == tmp_path / "flag"
    assert settings.shuffle_partitions == 7
    assert settings.derive_missing_event_id is True
    # Kafka's data-loss check is on unless turned off for a run.
    assert config.load(environ={}).kafka_fail_on_data_loss is True
    assert config.load(environ={"LAKEHOUSE_KAFKA_FAIL_ON_DATA_LOSS": " false"}
                       ).kafka_fail_on_data_loss is False


def test_config_file_named_by_environment(tmp_path: Path) -> None:
    extra = tmp_path / "lake.toml"
    extra.write_text('window_duration = "10 seconds"\n')
    settings = config.load(environ={"LAKEHOUSE_CONFIG": str(extra)})
    assert settings.window_duration == "10 seconds"


def test_a_root_is_a_local_folder_a_file_uri_or_a_bucket_s_folder(tmp_path: Path) -> None:
    assert config.load({"root": f"file://{tmp_path}/lake"}, environ={}).root == tmp_path / "lake"
    assert config.load({"root": f"file://localhost{tmp_path}/a%20lake"},
                       environ={}).root == tmp_path / "a lake"
    for elsewhere, message in (("file://nas/lake", "on another machine"),
                               ("s3a:/bucket/lake", "write it as s3a://bucket/folder"),
                               ("s3a://", "name the bucket"),
                               ("gs://bucket/lake", "a gs:// root is not supported")):
        with pytest.raises(ConfigError, match=message):
            config.load({"root": elsewhere}, environ={})
    # An object-store root stays the URI, and so does every place under it (before, it
    # became a folder named after it under the working directory, without a word).
    on_store = config.load({"root": "s3a://bucket/lake/"}, environ={})
    assert str(on_store.root) == "s3a://bucket/lake"
    assert str(on_store.landing_events) == "s3a://bucket/lake/landing/events"
    assert on_store.checkpoint("silver_ad_events") == "s3a://bucket/lake/checkpoints/silver_ad_events"
    assert on_store.table_path("silver/ad_events") == "s3a://bucket/lake/tables/silver/ad_events"
    assert str(on_store.replace(window_duration="10 seconds").root) == "s3a://bucket/lake"
    # What must stay on this machine says so.
    with pytest.raises(ConfigError, match="run lakehouse services with a local --root"):
        assert on_store.services_dir is None  # raises before: not a folder here
    # And from the command line, with a non-zero exit and no folder made.
    refused = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "audit", "--root",
                              "gs://bucket/lake"], cwd=tmp_path, capture_output=True,
                             text=True, env=cli_env())
    assert refused.returncode != 0 and "a gs:// root is not supported" in refused.stderr
    assert not list(tmp_path.iterdir())
    # An empty or missing root is refused too: it became the working folder, or a folder
    # literally named "None" for a copy with root=None.
    loaded = config.load({"root": tmp_path / "lake"}, environ={})
    for nothing in (None, "", "  "):
        with pytest.raises(ConfigError, match="root is empty"):
            loaded.replace(root=nothing)
    with pytest.raises(ConfigError, match="root is empty"):
        config.load(environ={"LAKEHOUSE_ROOT": ""})


@pytest.mark.parametrize(("env", "message"), [
    ({"LAKEHOUSE_SOURCE": "ftp"}, "source must be one of"),
    ({"LAKEHOUSE_SHUFFLE_PARTITIONS": "many"}, "must be an integer"),
    ({"LAKEHOUSE_SHUFFLE_PARTITIONS": "0"}, "at least 1"),
    ({"LAKEHOUSE_TRIGGER_INTERVAL": "soon"}, "trigger_interval: not an interval"),
    ({"LAKEHOUSE_DERIVE_MISSING_EVENT_ID": "maybe"}, "true or false"),
    ({"LAKEHOUSE_KAFKA_FAIL_ON_DATA_LOSS": "perhaps"}, "kafka_fail_on_data_loss must be true"),
    ({"LAKEHOUSE_KAFKA_MAX_OFFSETS_PER_TRIGGER": "0"}, "at least 1"),
    ({"LAKEHOUSE_DELTA_SNAPSHOT_PARTITIONS": "0"}, "delta_snapshot_partitions.*at least 1"),
    # The launcher would pass -Xmx3 (3 bytes), and no JVM would start.
    ({"LAKEHOUSE_SPARK_DRIVER_MEMORY": "3"}, "spark_driver_memory: '3' is not a memory size"),
    ({"LAKEHOUSE_SPARK_DRIVER_MEMORY": "lots"}, "is not a memory size such as 3g"),
])
def test_bad_values_are_refused_with_a_clear_message(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.load(environ=env)


def test_lists_unknown_keys_and_copies_are_checked(tmp_path: Path) -> None:
    extra = tmp_path / "lake.toml"
    extra.write_text('extra_event_time_formats = ["yyyy-MM-dd HH:mm:ss"]\n')
    settings = config.load(environ={"LAKEHOUSE_CONFIG": str(extra)})
    assert settings.extra_event_time_formats == ("yyyy-MM-dd HH:mm:ss",)
    # From the environment, comma-separated text.
    assert config.load(environ={"LAKEHOUSE_EXTRA_EVENT_TIME_FORMATS": "a, b,"}
                       ).extra_event_time_formats == ("a", "b")
    extra.write_text('windw = "1s"\n')
    with pytest.raises(ConfigError, match="unknown configuration keys: windw"):
        config.load(environ={"LAKEHOUSE_CONFIG": str(extra)})
    with pytest.raises(ConfigError, match="cannot read LAKEHOUSE_CONFIG"):
        config.load(environ={"LAKEHOUSE_CONFIG": str(tmp_path / "missing.toml")})
    # A copy is validated as a loaded one is, and stays hashable.
    with pytest.raises(ConfigError, match="source must be one of"):
        settings.replace(source="ftp")
    assert hash(settings.replace(window_duration="10 seconds")) != hash(settings)


@pytest.mark.parametrize(("text", "seconds", "spark_form"), [
    ("5s", 5, "5 seconds"),
    ("10 minutes", 600, "600 seconds"),
    ("1 hour", 3600, "3600 seconds"),
    ("500ms", 0.5, "500 milliseconds"),
])
def test_intervals(text: str, seconds: float, spark_form: str) -> None:
    assert config.interval_seconds(text) == seconds
    assert config.spark_interval(text) == spark_form


def test_airflow_on_sqlite_waits_for_the_database_lock(tmp_path: Path) -> None:
    """Airflow's own engine, as its processes build it, waits 30 s for SQLite's lock (not
    the driver's 5 s, after which the API server answered 503)."""
    settings = config.load({"root": tmp_path / "lake"}, environ={})
    probe = ("from airflow import settings; "
             "print(settings.engine.connect().exec_driver_sql('PRAGMA busy_timeout').scalar())")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=environment(settings, cli_env()), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "30000"
    # PostgreSQL takes other connection arguments: none are set for it, nor for a user's
    # own Airflow home, whose airflow.cfg may name it.
    for users in ({"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow@db/airflow"},
                  {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD": "cat /run/secrets/airflow-db"},
                  {"AIRFLOW_HOME": str(tmp_path / "users-airflow")}):
        assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS" not in environment(settings, users)


# Airflow's backfill creates each run in a savepoint: read the latest run, then insert.
# Another process (here a plain sqlite3 connection, as the scheduler would) writes between
# the read and the insert. It must wait for the savepoint's transaction, not make the insert
# fail at once on a stale snapshot, which the API turned into a 503 for the backfill dialog.
_SAVEPOINT_RACE = """
import sqlite3, threading
from sqlalchemy import text
from airflow import settings
with settings.engine.begin() as connection:
    connection.exec_driver_sql("CREATE TABLE IF NOT EXISTS probe (writer TEXT)")
def scheduler_writes():
    scheduler = sqlite3.connect(settings.engine.url.database, timeout=30)
    scheduler.execute("INSERT INTO probe VALUES ('scheduler')")
    scheduler.commit()
session = settings.Session()
with session.begin_nested():
    session.execute(text("SELECT count(*) FROM probe")).scalar()
    scheduler = threading.Thread(target=scheduler_writes)
    scheduler.start()
    scheduler.join(timeout=1)
    session.execute(text("INSERT INTO probe VALUES ('backfill')"))
session.commit()
scheduler.join()
print(sorted(row[0] for row in session.execute(text("SELECT writer FROM probe"))))
"""


def test_airflow_on_sqlite_serialises_a_savepoint_with_the_scheduler_s_writes(
        tmp_path: Path) -> None:
    settings = config.load({"root": tmp_path / "lake"}, environ={})
    done = subprocess.run([sys.executable, "-c", _SAVEPOINT_RACE], capture_output=True,
                          text=True, env=environment(settings, cli_env()), timeout=120)
    # Without BEGIN IMMEDIATE the insert fails with "database is locked" while the
    # scheduler's row is already committed.
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "['backfill', 'scheduler']"
