"""The Spark driver's class-data archive: a cold Spark command takes about a fifth less time.

Every ``lakehouse`` command, Airflow task and test that touches Spark starts a JVM that loads
and verifies some 15,000 classes (Spark, Delta, RocksDB's streaming state) before its first
job: on 2 cores, 6 to 7 s to a session and 6 to 8 s more to its first Delta table. The
JDK's class-data sharing maps those classes from an archive instead (``make bench``'s
start-up part measures it side by side). ``make setup`` builds the archive once, from a
small pipeline run through every layer, into the jars folder; ``session`` hands it to the
driver's JVM when it is there. The JVM checks that the archive matches its own build and
class path and ignores one that does not (a new venv, other jars, another JDK), so a stale
archive costs only its speed-up: ``make setup`` builds it again whenever the venv, the jars
or the ``java`` binary change. Only the driver maps it, and only with ``spark_java_options``
set (empty leaves the JVM options to ``spark-defaults.conf``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from spark_jobs.config import Settings

ARCHIVE_NAME = "classes.jsa"
# The JVM reports each class it cannot archive, and an archive it cannot use, as a warning
# on the console: neither is the user's concern (an unusable archive is simply not used).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_path(settings: Settings) -> Path:
    """Beside the jars it was built with: fetching other jars clears the folder."""
    return settings.jars_dir / ARCHIVE_NAME


def use_options(settings: Settings) -> str:
    """The driver JVM's options that map the archive, or none while it is not built."""
    archive = archive_path(settings)
    # Quoted: Spark's launcher splits the options at blanks, except inside quotes.
    return f'-XX:SharedArchiveFile="{archive}" {QUIET}' if archive.is_file() else ""


def build(settings: Settings, target: Path) -> None:
    """Run every layer over a few hundred generated events in a JVM that writes the classes
    it loaded to ``target`` as it exits."""
    from spark_jobs import streaming
    from spark_jobs.landing_feed import generate
    from spark_jobs.session import build_spark

    with tempfile.TemporaryDirectory(prefix="lakehouse-classes-") as scratch:
        root = Path(scratch) / "lake"
        training = settings.replace(root=root)
        generate(root, "--events", "400", "--events-per-file", "100", "--span", "2 hours")
        partial = target.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        spark = build_spark(training, app_name="lakehouse-class-archive",
                            extra_driver_options=f'-XX:ArchiveClassesAtExit="{partial}" {QUIET}')
        gateway = spark.sparkContext._gateway.proc  # the JVM PySpark started
        try:
            streaming.run_available_now(spark, training, list(streaming.LAYERS))
            spark.stop()
        finally:
            # The gateway JVM exits when its stdin closes, writing the archive as it does.
            gateway.stdin.close()
            try:
                exit_code = gateway.wait(timeout=300)
            except subprocess.TimeoutExpired:
                gateway.kill()
                exit_code = gateway.wait()
        # Only a JVM that exited cleanly wrote a whole archive; a torn one can crash a JVM
        # that maps it.
        if exit_code != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"the JVM exited with {exit_code} and no class archive")
        os.replace(partial, target)


def main(argv: list[str] | None = None) -> int:
    from spark_jobs import config

    parser = argparse.ArgumentParser(prog="python -m spark_jobs.class_archive",
                                     description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    settings = config.load()
    target = archive_path(settings)
    target.unlink(missing_ok=True)  # never build on top of the archive being replaced
    build(settings, target)
    print(f"class archive: {target} ({target.stat().st_size // 2**20} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
