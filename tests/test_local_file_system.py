"""Hadoop's local file system without a process per rename and per file created
(``jars/localfs``): the same answers as Hadoop's own, and no process started."""

import os
import stat
from collections.abc import Callable
from pathlib import Path

from py4j.protocol import Py4JJavaError

from spark_jobs.session import LOCAL_FS_JAR, VALIDATION_JAR, spark_conf
from tests.conftest import make_settings


def _file_systems(spark) -> dict[str, object]:
    """Hadoop's raw local file system and ours, each initialised on this session's
    configuration."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    uri = jvm.java.net.URI.create("file:///")
    systems = {"hadoop": jvm.org.apache.hadoop.fs.RawLocalFileSystem(),
               "ours": getattr(jvm.lakehouse, "ForklessLocalFileSystem$Raw")()}
    for system in systems.values():
        system.initialize(uri, conf)
    return systems


def _processes_started(spark, tmp_path: Path, action: Callable[[], object]) -> int:
    """How many processes the JVM started during ``action`` (its Flight Recorder's
    ``jdk.ProcessStart`` events)."""
    jvm = spark._jvm
    recording = jvm.jdk.jfr.Recording()
    recording.enable("jdk.ProcessStart")
    recording.start()
    try:
        action()
    finally:
        recording.stop()
    dump = tmp_path / f"processes-{id(action)}.jfr"
    recording.dump(jvm.java.io.File(str(dump)).toPath())
    recording.close()
    events = jvm.jdk.jfr.consumer.RecordingFile.readAllEvents(
        jvm.java.io.File(str(dump)).toPath())
    return sum(1 for event in events if event.getEventType().getName() == "jdk.ProcessStart")


def test_a_local_session_uses_it_through_both_of_hadoops_apis(spark, tmp_path) -> None:
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    path = jvm.org.apache.hadoop.fs.Path(f"file:{tmp_path}")
    # The FileSystem API (Parquet's files, Delta's reads) and FileContext's (Spark's
    # checkpoint files, Delta's commits).
    assert path.getFileSystem(conf).getClass().getName() == "lakehouse.ForklessLocalFileSystem"
    assert (jvm.org.apache.hadoop.fs.AbstractFileSystem.get(path.toUri(), conf)
            .getClass().getName()) == "lakehouse.ForklessLocalFs"
    # A local master's driver has every jar on its class path, and ships none; a cluster's
    # executors get the jars and keep Hadoop's own file system.
    jars = sorted(make_settings(tmp_path).jars_dir.glob("*.jar"))
    local = spark_conf(make_settings(tmp_path / "lake"))
    assert local["spark.driver.extraClassPath"].split(os.pathsep) == [str(jar) for jar in jars]
    assert "spark.jars" not in local
    cluster = spark_conf(make_settings(tmp_path / "lake", spark_master="spark://10.0.0.5:7077"))
    assert cluster["spark.jars"].split(",") == [str(jar) for jar in jars]
    assert not {"spark.driver.extraClassPath", "spark.hadoop.fs.file.impl",
                "spark.hadoop.fs.AbstractFileSystem.file.impl"} & cluster.keys()
    # A jar folder without it (set by hand): Hadoop's own.
    bare = tmp_path / "jars"
    bare.mkdir()
    (bare / VALIDATION_JAR).write_bytes(b"")
    assert "spark.hadoop.fs.file.impl" not in spark_conf(make_settings(tmp_path / "lake",
                                                                       jars_dir=bare))
    (bare / LOCAL_FS_JAR).write_bytes(b"")
    assert spark_conf(make_settings(tmp_path / "lake", jars_dir=bare))[
        "spark.hadoop.fs.file.impl"] == "lakehouse.ForklessLocalFileSystem"


def test_a_paths_link_status_is_hadoops_own_without_a_process(spark, tmp_path) -> None:
    jvm = spark._jvm
    (tmp_path / "file").write_text("four", "utf-8")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "file")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    systems = _file_systems(spark)

    def status(system, name: str, scheme: str = "file:") -> tuple:
        try:
            found = system.getFileLinkStatus(
                jvm.org.apache.hadoop.fs.Path(f"{scheme}{tmp_path / name}"))
        except Py4JJavaError as refused:
            return (refused.java_exception.getClass().getName(),)
        return (found.getPath().toString(), found.isDirectory(), found.isSymlink(),
                found.getLen(), found.getModificationTime(),
                found.getSymlink().toString() if found.isSymlink() else None)

    # Paths as Spark and Delta give them (file:...), and without a scheme.
    for scheme in ("file:", ""):
        for name in ("file", "folder", "link", "dangling", "missing"):
            assert status(systems["ours"], name, scheme) == status(systems["hadoop"], name,
                                                                   scheme), (scheme, name)
    # Hadoop tells a link apart when its path has no scheme ("file:" makes its readlink
    # fail), so ours does too; a path that is not there is a FileNotFoundException.
    assert status(systems["ours"], "link", "")[2] and not status(systems["ours"], "file", "")[2]
    assert status(systems["ours"], "missing") == ("java.io.FileNotFoundException",)
    # Hadoop's own starts a process (readlink) for each; ours none for a file or folder.
    assert _processes_started(spark, tmp_path, lambda: status(systems["hadoop"], "file")) > 0
    assert _processes_started(spark, tmp_path, lambda: [
        status(systems["ours"], name) for name in ("file", "folder")]) == 0


def test_permissions_are_set_as_hadoops_own_sets_them_without_a_process(spark,
                                                                         tmp_path) -> None:
    jvm = spark._jvm
    systems = _file_systems(spark)
    permission = jvm.org.apache.hadoop.fs.permission.FsPermission

    def mode_after(system_name: str, kind: str, mode: int) -> int:
        target = tmp_path / f"{system_name}-{kind}-{mode:o}"
        target.mkdir() if kind == "folder" else target.write_bytes(b"")
        systems[system_name].setPermission(jvm.org.apache.hadoop.fs.Path(f"file:{target}"),
                                           permission(mode))
        return stat.S_IMODE(target.stat().st_mode)

    # Each bit alone (the owner's read is 0o400), none, all, and the usual modes; the
    # sticky bit (0o1000, which the JDK cannot set) goes to Hadoop's own way.
    modes = [1 << bit for bit in range(9)] + [0, 0o777, 0o640, 0o755, 0o1777]
    for mode in modes:
        for kind in ("file", "folder"):
            assert mode_after("ours", kind, mode) == mode_after("hadoop", kind, mode) == mode
    assert _processes_started(spark, tmp_path, lambda: mode_after("hadoop", "file", 0o640)) > 0
    assert _processes_started(spark, tmp_path, lambda: [
        mode_after("ours", kind, 0o644) for kind in ("file", "folder")]) == 0


def test_spark_s_checkpoint_files_are_written_and_renamed_into_place(spark, tmp_path) -> None:
    # What a stream's offset log does through FileContext: a file written to a temporary
    # name, renamed over, then read back; and no process for any of it.
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    folder = jvm.org.apache.hadoop.fs.Path(f"file:{tmp_path / 'offsets'}")
    manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager

    def write(version: int, text: str) -> None:
        files = manager.create(folder, conf)
        files.mkdirs(folder)
        stream = files.createAtomic(jvm.org.apache.hadoop.fs.Path(folder, str(version)), True)
        stream.write(text.encode())
        stream.close()

    assert _processes_started(spark, tmp_path, lambda: [write(0, "first"),
                                                        write(0, "second")]) == 0
    assert (tmp_path / "offsets" / "0").read_text("utf-8") == "second"
    # Only the file and Hadoop's checksum of it: no temporary file left behind.
    assert sorted(path.name for path in (tmp_path / "offsets").iterdir()) == [".0.crc", "0"]
