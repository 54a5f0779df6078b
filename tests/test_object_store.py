"""Delta tables on an object store (s3a://), against the S3-compatible server the project
starts (`lakehouse services start s3`, moto's): commits go through the project's log store,
one conditional PUT each, so that S3 itself refuses a second writer of a version."""

import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError

from lakehouse_airflow import views
from spark_jobs import delta_reader, storage
from spark_jobs.config import LOOPBACK, ConfigError
from spark_jobs.gold import writer
from spark_jobs.ops import leases, store_leases
from spark_jobs.session import spark_conf
from tests.conftest import cli_env, make_settings
from tests.processes import lakehouse_command, run_lakehouse

pytestmark = pytest.mark.integration

BUCKET = "lakehouse"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def s3(spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The project's S3 server on a free loopback port with one bucket, and the test
    session's Spark pointed at it as the settings would point a driver: its endpoint keys
    from ``spark_conf``, credentials as the AWS SDK's chain would find them."""
    root = tmp_path_factory.mktemp("s3-service")
    endpoint = f"http://{LOOPBACK}:{_free_port()}"
    env = {"LAKEHOUSE_S3_ENDPOINT": endpoint}
    started = run_lakehouse("services", "start", "s3", "--root", str(root), env=env)
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith(f"s3: started, S3 API at {endpoint}"), started.stdout
    # The server takes any credentials; a bucket is created as S3 creates one (a PUT).
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT"),
                           timeout=30).close()
    hadoop = spark._jsc.hadoopConfiguration()
    conf = spark_conf(make_settings(root, s3_endpoint=endpoint))
    for key, value in conf.items():
        if key.startswith("spark.hadoop.fs.s3a."):
            hadoop.set(key.removeprefix("spark.hadoop."), value)
    hadoop.set("fs.s3a.access.key", "lakehouse-test")
    hadoop.set("fs.s3a.secret.key", "lakehouse-test")
    # This process's own readers (PyArrow, delta-rs) find them where the AWS SDK looks.
    credentials = {"AWS_ACCESS_KEY_ID": "lakehouse-test",
                   "AWS_SECRET_ACCESS_KEY": "lakehouse-test"}
    before = {name: os.environ.get(name) for name in credentials}
    os.environ.update(credentials)
    yield endpoint, root
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    stopped = run_lakehouse("services", "stop", "s3", "--root", str(root), env=env)
    assert stopped.returncode == 0 and stopped.stdout.strip() == "s3: stopped", stopped


def test_the_s3_settings_are_checked_and_only_an_endpoint_adds_s3a_keys(tmp_path) -> None:
    with pytest.raises(ConfigError, match="s3_endpoint: 'ftp://store' is not an http"):
        make_settings(tmp_path, s3_endpoint="ftp://store")
    # No credentials in a URL: they would show in Spark's settings and in logs, and the
    # message does not repeat them.
    for key, value in (("s3_endpoint", "http://key:secret@127.0.0.1:9000"),
                       ("root", "s3a://key:secret@bucket/lake")):
        with pytest.raises(ConfigError, match="no credentials in the") as refused:
            make_settings(tmp_path, **{key: value}) if key != "root" else make_settings(value)
        assert "secret" not in str(refused.value)
    assert not any("s3a" in key for key in spark_conf(make_settings(tmp_path))
                   if key.startswith("spark.hadoop."))
    conf = spark_conf(make_settings(tmp_path, s3_endpoint="https://store.example:9443"))
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "https://store.example:9443"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"
    # No credential is ever a setting: S3A takes them from the AWS SDK's chain.
    assert not any("key" in key.lower() for key in conf if "s3a" in key)
    # The local server needs a loopback http:// endpoint, and says so.
    refused = run_lakehouse("services", "start", "s3", "--root", str(tmp_path),
                            env={"LAKEHOUSE_S3_ENDPOINT": "https://store.example:9443"})
    assert refused.returncode != 0
    assert "must be an http:// URL on loopback" in refused.stderr


def test_a_delta_table_on_s3_commits_through_the_conditional_put_log_store(spark, s3) -> None:
    path = f"s3a://{BUCKET}/tables/appended"
    spark.range(5).write.format("delta").save(path)
    spark.range(5, 8).write.format("delta").mode("append").save(path)
    # Both commits are there and read back: 5 rows, then 3 more.
    assert spark.read.format("delta").load(path).count() == 8
    jvm = spark._jvm
    store = (jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
             .store().getDelegate(jvm.org.apache.hadoop.fs.Path(path)))
    assert store.logStoreImpl().getClass().getName() == "lakehouse.ConditionalPutS3LogStore"
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    assert sorted(row.version for row in history) == [0, 1]


def test_s3_refuses_a_second_writer_of_a_version_and_keeps_the_first(spark, s3) -> None:
    endpoint, root = s3
    jvm = spark._jvm
    hadoop = spark._jsc.hadoopConfiguration()
    store = jvm.lakehouse.ConditionalPutS3LogStore(hadoop)
    version = jvm.org.apache.hadoop.fs.Path(
        f"s3a://{BUCKET}/tables/raced/_delta_log/{0:020d}.json")

    def lines(*texts: str):
        actions = jvm.java.util.ArrayList()
        for text in texts:
            actions.add(text)
        return actions.iterator()

    store.write(version, lines('{"first":1}'), False, hadoop)
    with pytest.raises(Py4JJavaError, match="java.nio.file.FileAlreadyExistsException"):
        store.write(version, lines('{"second":2}'), False, hadoop)
    read = store.read(version, hadoop)
    assert [read.next() for _ in range(1)] == ['{"first":1}'] and not read.hasNext()
    # The store made no check of its own before the PUT: S3 refused it (412, Precondition
    # Failed), as it would a writer in another driver. The server's log has both PUTs.
    key = f"/{BUCKET}/tables/raced/_delta_log/{0:020d}.json"
    log = re.sub(r"\x1b\[[0-9;]*m", "", (root / "services" / "s3" / "moto.log").read_text())
    requests = [re.search(r'"(\w+) (\S+) HTTP/[\d.]+" (\d+)', line) for line in log.splitlines()]
    answers = [(found[1], found[3]) for found in requests if found and found[2] == key]
    # Two PUTs and nothing before them (the reads after are the check above).
    assert answers[:2] == [("PUT", "200"), ("PUT", "412")], log[-3000:]


def test_drivers_appending_at_once_lose_no_commit(spark, s3) -> None:
    """Two writers append to one table at the same time: each version is won by one of
    them, the loser retries at the next, and every append is in the table."""
    endpoint, root = s3
    path = f"s3a://{BUCKET}/tables/concurrent"
    spark.range(0).write.format("delta").save(path)
    failures: list[BaseException] = []
    together = threading.Barrier(2, timeout=300)
    rounds = 4

    def append(writer: int) -> None:
        try:
            for batch in range(rounds):
                together.wait()  # both read the same version, then race for the next
                first = writer * 1_000 + batch * 10
                spark.range(first, first + 10).write.format("delta").mode("append").save(path)
        except BaseException as error:  # reported below, not lost in the thread
            together.abort()
            failures.append(error)

    threads = [threading.Thread(target=append, args=(number,)) for number in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not failures, failures
    # 2 writers x 4 appends x 10 distinct ids; one commit per append after the creation.
    table = spark.read.format("delta").load(path)
    assert table.count() == table.distinct().count() == 80
    assert spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count() == 1 + 2 * rounds
    # And they did race: S3 refused the slower writer of a version at least once.
    log = (root / "services" / "s3" / "moto.log").read_text()
    assert re.search(r"PUT /lakehouse/tables/concurrent/_delta_log/\d{20}\.json HTTP/1\.1"
                     r"\S*\" 412", log), "no version was contested"


def test_the_project_s_own_files_and_readers_work_on_the_store(spark, s3, tmp_path) -> None:
    """What the project reads and writes without Spark (Delta's log, delta-rs reads,
    plain files) takes an s3a:// location as it takes a local one."""
    endpoint, _ = s3
    make_settings(tmp_path, s3_endpoint=endpoint)  # loading the settings names the store
    # A local location stays pathlib's own.
    assert type(storage.lake_path(str(tmp_path / "here"))) is type(tmp_path)
    # Files: written, listed, moved, read and removed on the store.
    folder = storage.lake_path(f"s3a://{BUCKET}/files/landing")
    (folder / "a.jsonl").write_text('{"event_id": "a"}\n', encoding="utf-8")
    assert [entry.name for entry in folder.iterdir()] == ["a.jsonl"]
    (folder / "a.jsonl").rename(storage.lake_path(f"s3a://{BUCKET}/files/archive/a.jsonl"))
    assert not (folder / "a.jsonl").exists()
    moved = storage.lake_path(f"s3a://{BUCKET}/files/archive/a.jsonl")
    assert moved.read_text(encoding="utf-8") == '{"event_id": "a"}\n'
    moved.unlink()
    assert not moved.exists()

    # A Delta table Spark wrote there, read back without Spark: 3 rows, then 2 more.
    path = f"s3a://{BUCKET}/tables/read_back"
    spark.range(3).write.format("delta").save(path)
    spark.range(3, 5).write.format("delta").mode("append").save(path)
    assert delta_reader.is_delta_table(path)
    assert not delta_reader.is_delta_table(f"s3a://{BUCKET}/tables/none")
    assert delta_reader.latest_version(path) == 1
    assert sorted(row["id"] for row in delta_reader.read_rows(path)) == [0, 1, 2, 3, 4]
    assert delta_reader.count_rows(path) == 5
    assert delta_reader.commit_info(path, 1)["operation"] == "WRITE"


def test_the_pipeline_runs_on_a_root_on_the_store_exactly(s3, tmp_path, tmp_path_factory
                                                          ) -> None:
    """``root = s3a://...``: the generator lands its events and expected counts there, the
    streams run every layer there twice (a second delivery in between), and the audit
    finds every record in exactly one place; nothing is written on local disk."""
    endpoint, _ = s3
    root = f"s3a://{BUCKET}/lake"
    # The Great Expectations context of a root on the store lives in the user's cache:
    # a home of the test's own.
    env = {"LAKEHOUSE_S3_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": "lakehouse-test",
           "AWS_SECRET_ACCESS_KEY": "lakehouse-test",
           "HOME": str(tmp_path_factory.mktemp("home"))}

    def lakehouse(*args: str) -> str:
        done = subprocess.run(lakehouse_command(*args, "--root", root), cwd=tmp_path,
                              env=cli_env(**env), capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    lakehouse("generate", "--events", "600", "--events-per-file", "200", "--seed", "5")
    settings = make_settings(root, s3_endpoint=endpoint)
    # 600 events in files of 200 (the mess adds redeliveries and blank lines, not files).
    assert len(list(settings.landing_events.iterdir())) == 3
    lakehouse("stream", "--available-now")
    lakehouse("generate", "--events", "300", "--events-per-file", "300", "--seed", "6")
    lakehouse("stream", "--available-now")
    audit = lakehouse("audit", "--expected")
    assert "unaccounted                        0" in audit, audit
    assert "accounted twice                    0" in audit, audit
    assert "expected counts" in audit and ": match" in audit, audit
    # The second run went on from the first one's checkpoints on the store: bronze read
    # only the new file, and has every delivery once.
    assert delta_reader.count_rows(f"{root}/tables/bronze/ad_events") == json.loads(
        settings.expected_counts_file.read_text("utf-8"))["delivered"]
    # The first run's files were archived on the store when the second planned its batch.
    waiting = [path.name for path in settings.landing_events.iterdir()]
    assert len(waiting) == 1 and "seed6" in waiting[0], waiting
    assert len(list(settings.landing_archive.rglob("events-seed5-*"))) == 3

    # A day reprocessed there finds it as the streams left it (the rebuild takes the gold
    # lease on the store, through its session), and SQL finds the tables by name.
    today = datetime.now(UTC).date().isoformat()
    rebuilt = lakehouse("reprocess", "--from", today, "--to", today)
    assert "silver.ad_events: unchanged" in rebuilt and "gold.campaign_stats: unchanged" in (
        rebuilt), rebuilt
    counted = lakehouse("sql", "SELECT count(*) AS n FROM bronze.ad_events")
    assert str(delta_reader.count_rows(f"{root}/tables/bronze/ad_events")) in counted, counted

    # Validation: its results in quality.results on the store, the report and the Data
    # Docs (built beside the local context) in the store's reports, which the UI serves.
    lakehouse("validate")
    assert delta_reader.count_rows(f"{root}/tables/quality/results") > 0
    report = views.latest_report(settings)
    assert report is not None and str(report).startswith(f"{root}/reports/quality-")
    served = views.report_file(report.name, settings)
    assert served is not None and "<html" in served.read_text("utf-8").lower()
    assert list((settings.reports_dir / "data_docs").rglob("*.html"))
    assert views.report_file("../tables/quality/results/_delta_log", settings) is None
    assert not list(tmp_path.iterdir())  # no folder named after the URI, nothing local


def test_a_lease_on_the_store_is_held_by_one_driver_renewed_and_let_go(spark, s3,
                                                                        monkeypatch) -> None:
    endpoint, _ = s3
    settings = make_settings(f"s3a://{BUCKET}/leased", s3_endpoint=endpoint)
    path = leases.lease_file(settings, "bronze")
    monkeypatch.setattr(store_leases, "RENEW_SECONDS", 0.5)
    with leases.leases(settings, ["bronze"]):
        first = store_leases.read(path)
        assert first["pid"] == os.getpid() and first["purpose"] == leases.STREAM
        assert leases.holder(settings, "bronze")["pid"] == os.getpid()
        # A second driver is refused, naming the first.
        with (pytest.raises(leases.LeaseHeld, match="already running under another driver"),
              leases.leases(settings, ["bronze"])):
            pass
        time.sleep(2)  # four renewals due
        assert store_leases.read(path)["renewed_at"] > first["renewed_at"]
    # Let go: marked released (a delete could remove a lease taken over meanwhile).
    assert store_leases.read(path)["released"] and leases.holder(settings, "bronze") is None
    # A write against a version that is no longer there is refused by S3 (If-Match).
    store = store_leases._Store(spark, path)
    with pytest.raises(store_leases.Refused):
        store.write({"pid": 0}, '"not-its-etag"')
    path.unlink()

    # A holder elsewhere that stopped renewing (killed, its machine gone) has expired once
    # the lease stays unchanged a while by this machine's clock: it is taken over. One that
    # renews holds it.
    monkeypatch.setattr(store_leases, "OBSERVE_SECONDS", 1.0)
    now = datetime.now(UTC)
    elsewhere = {"pid": 1, "host": "another-machine", "since": now.isoformat(),
                 "purpose": leases.STREAM}
    expired = now - timedelta(seconds=2 * store_leases.EXPIRY_SECONDS)
    path.write_text(json.dumps(elsewhere | {"renewed_at": expired.isoformat()}), "utf-8")
    assert leases.holder(settings, "bronze") is None
    with leases.leases(settings, ["bronze"]):
        assert store_leases.read(path)["pid"] == os.getpid()
    path.write_text(json.dumps(elsewhere | {"renewed_at": now.isoformat()}), "utf-8")
    assert leases.holder(settings, "bronze")["host"] == "another-machine"
    with pytest.raises(leases.LeaseHeld, match="another-machine"), leases.leases(
            settings, ["bronze"]):
        pass
    path.unlink()


def test_a_rebuild_request_on_the_store_is_claimed_or_withdrawn_never_both(spark, s3) -> None:
    """A reprocess hands its gold rebuild to the driver by a request the driver claims and
    the reprocess may withdraw: on local disk two renames of one file, of which one wins; on
    the store, which cannot rename atomically, a marker only one side can create."""
    endpoint, _ = s3
    settings = make_settings(f"s3a://{BUCKET}/handed", s3_endpoint=endpoint)
    folder = writer.requests_dir(settings)
    for first, second in (("claimed", "withdrawn"), ("withdrawn", "claimed")):
        name = f"asked-{first}"
        (folder / f"{name}.request").write_text('{"from": "2026-11-27"}', "utf-8")
        writer._decide(folder, name, first)
        with pytest.raises(FileNotFoundError, match="decided by the other side"):
            writer._decide(folder, name, second)
        # The request moved under the winner's name, whole; nothing under the loser's.
        assert not (folder / f"{name}.request").exists()
        assert (folder / f"{name}.{first}").read_text("utf-8") == '{"from": "2026-11-27"}'
        assert not (folder / f"{name}.{second}").exists()
