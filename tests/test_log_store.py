"""The project's Delta log store for local disk lists exactly what Delta's own does."""

from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError

from spark_jobs.config import ConfigError
from spark_jobs.session import LOG_STORE_JAR, VALIDATION_JAR, spark_conf
from tests.conftest import make_settings


def _names(statuses) -> list[str]:
    return [entry[0].rsplit("/", 1)[-1] for entry in _entries(statuses)]


def _entries(statuses) -> list[tuple[str, int, bool]]:
    """Each status's qualified path, length and whether it is a folder."""
    entries = []
    while statuses.hasNext():
        status = statuses.next()
        entries.append((status.getPath().toString(), status.getLen(), status.isDirectory()))
    return entries


def test_the_listing_from_a_version_is_delta_s_own(spark, tmp_path) -> None:
    # A table folder with a space and a letter outside ASCII, as a user may name one.
    log = tmp_path / "ad events é" / "_delta_log"
    log.mkdir(parents=True)
    entries = [f"{version:020d}.json" for version in range(12)]
    entries += [f"{version:020d}.crc" for version in range(12)]
    entries += [f"{10:020d}.checkpoint.parquet", "_last_checkpoint",
                # Hadoop's checksum of a file, hidden; a commit being written, hidden
                f".{11:020d}.json.crc", f".{12:020d}.json.5d1e.tmp"]
    for name in entries:
        (log / name).write_text("{}\n")
    (log / "_staged_commits").mkdir()  # Delta 4's folder for commits not yet published
    # What another tool may leave: a name with ':' (a copy's zone marker), a dangling link.
    (log / f"{11:020d}.json:Zone.Identifier").write_text("")
    (log / "_zz-dangling").symlink_to(tmp_path / "nowhere")
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    ours = jvm.lakehouse.FolderListingLogStore(conf)
    deltas = jvm.io.delta.storage.HDFSLogStore(conf)
    for start in (f"{0:020d}.json", f"{10:020d}.checkpoint.parquet", f"{11:020d}.json",
                  f"{12:020d}.json", "_last_checkpoint"):
        # As a plain path, and with the scheme as Hadoop writes it (not percent-encoded).
        for written in (str(log / start), f"file:{log / start}"):
            path = jvm.org.apache.hadoop.fs.Path(written)
            expected = _entries(deltas.listFrom(path, conf))
            assert _entries(ours.listFrom(path, conf)) == expected, written
            assert expected, start  # each start above has something at or after it
    # From version 11's commit: it, then what sorts after every version's name (its
    # checksum, ".crc", sorts before ".json"; the hidden files before every version; a
    # dangling link is no entry to Hadoop either).
    assert _names(ours.listFrom(jvm.org.apache.hadoop.fs.Path(str(log / f"{11:020d}.json")),
                                conf)) == [f"{11:020d}.json",
                                           f"{11:020d}.json:Zone.Identifier",
                                           "_last_checkpoint", "_staged_commits"]
    # A folder that is not there is refused as Delta's own refuses it.
    missing = jvm.org.apache.hadoop.fs.Path(str(tmp_path / "nothing" / f"{0:020d}.json"))
    for store in (deltas, ours):
        with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
            store.listFrom(missing, conf)


def test_spark_uses_it_for_local_paths_when_make_setup_built_it(spark, tmp_path) -> None:
    assert spark.conf.get("spark.delta.logStore.file.impl") == "lakehouse.FolderListingLogStore"
    # Delta resolves it for a local table's log (not only the setting is there): by the
    # scheme of the log's path, which Delta qualifies ("file:").
    table = str(tmp_path / "resolved")
    spark.range(1).write.format("delta").save(table)
    jvm = spark._jvm
    store = (jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, table)
             .store().getDelegate(jvm.org.apache.hadoop.fs.Path(f"file:{table}")))
    assert store.logStoreImpl().getClass().getName() == "lakehouse.FolderListingLogStore"
    # Without the jar (a jar folder set by hand), Delta's own log store stays.
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "delta-spark.jar").write_bytes(b"")
    # Silver's record reader is no option: a folder without it is refused, saying how to
    # build it, before a JVM starts.
    with pytest.raises(ConfigError, match="scripts/build-jar.sh validation"):
        spark_conf(make_settings(tmp_path / "lake", jars_dir=jars))
    (jars / VALIDATION_JAR).write_bytes(b"")
    conf = spark_conf(make_settings(tmp_path / "lake", jars_dir=jars))
    assert "spark.delta.logStore.file.impl" not in conf
    (jars / LOG_STORE_JAR).write_bytes(b"")
    conf = spark_conf(make_settings(tmp_path / "lake", jars_dir=jars))
    assert conf["spark.delta.logStore.file.impl"] == "lakehouse.FolderListingLogStore"
    # And a table's log goes through it: what Delta wrote, Delta reads back.
    path = str(tmp_path / "table")
    spark.range(3).write.format("delta").save(path)
    spark.range(2).write.format("delta").mode("append").save(path)
    assert spark.read.format("delta").load(path).count() == 5
    assert Path(path, "_delta_log", f"{1:020d}.json").exists()
