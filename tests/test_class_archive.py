"""The class-data archive ``make setup`` builds: the driver maps it, and it fits the JVM and
class path the project's drivers run with (a stale one would be silently ignored)."""

import subprocess
import sys

from spark_jobs import class_archive, config
from spark_jobs.session import VALIDATION_JAR, spark_conf
from tests.conftest import cli_env

DRIVER, EXECUTOR = "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"


def test_only_the_driver_maps_the_archive_and_only_once_it_is_built(tmp_path) -> None:
    jars = tmp_path / "jars"
    jars.mkdir()
    for name in ("delta-spark.jar", VALIDATION_JAR):
        (jars / name).write_bytes(b"")
    settings = config.load({"root": tmp_path / "lake", "jars_dir": jars}, environ={})
    conf = spark_conf(settings)
    # Not built yet: the configured options alone (a missing archive would also turn off
    # the JDK's own default sharing).
    assert conf[DRIVER] == conf[EXECUTOR] == settings.spark_java_options

    (jars / class_archive.ARCHIVE_NAME).write_bytes(b"built")
    conf = spark_conf(settings)
    # Quoted, so a folder with a blank in its name stays one option for Spark's launcher.
    assert conf[DRIVER] == (f'{settings.spark_java_options} -XX:SharedArchiveFile="'
                            f'{jars / class_archive.ARCHIVE_NAME}" {class_archive.QUIET}')
    # An executor on another machine has no such file.
    assert conf[EXECUTOR] == settings.spark_java_options
    # Options left to spark-defaults.conf: the archive with them.
    assert DRIVER not in spark_conf(settings.replace(spark_java_options=""))


def test_the_built_archive_fits_the_project_s_driver_jvm(tmp_path) -> None:
    """``-Xshare:on`` makes a JVM that cannot map the archive fail instead of ignoring it
    (tried: a truncated archive fails this test). The jars and the archive are linked into a
    folder with a blank in its name, as a user's checkout may have."""
    built = config.load({"root": tmp_path / "lake"}, environ={})
    assert class_archive.archive_path(built).is_file(), "make setup builds it"
    jars = tmp_path / "a folder" / "jars"
    jars.mkdir(parents=True)
    for source in [*built.jars_dir.glob("*.jar"), class_archive.archive_path(built)]:
        (jars / source.name).symlink_to(source)
    overrides = {"root": str(tmp_path / "lake"), "jars_dir": str(jars)}
    script = ("from spark_jobs import config; from spark_jobs.session import build_spark; "
              f"spark = build_spark(config.load({overrides!r}, environ={{}}), "
              "extra_driver_options='-Xshare:on'); "
              "print('rows', spark.range(3).count()); spark.stop()")
    done = subprocess.run([sys.executable, "-c", script], env=cli_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "rows 3" in done.stdout, done.stderr[-3000:]
