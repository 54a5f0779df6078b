"""The landing zone as a stream source: every file read whole, once, however old it is."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Spark's file source forgets files older than ``maxFileAge`` (7 days by default) behind the
# newest file it has seen, and skips without a word any such file that lands later: a
# backfill copied with its modification times kept (``cp -p``, ``rsync -a``) would never be
# read. No delivered file is too old to ingest. The source then remembers every file it has
# read, in memory as in its log: a path per file.
NO_MAXIMUM_AGE = "36500d"


def whole_files(spark: SparkSession, folder: Path, glob: str,
                max_files_per_trigger: int | None = None, *, cleanup: str = "off",
                archive: Path | None = None) -> DataFrame:
    """New files of ``folder`` matching ``glob``, one row each: ``value`` (the whole text)
    and ``file_path``.

    ``cleanup`` (Spark's ``cleanSource``): what becomes of a file once the batch that read
    it is committed and the stream plans its next one: ``archive`` moves it under
    ``archive`` (at its own path), ``delete`` removes it, ``off`` leaves it. Spark lists the
    whole folder every trigger, so the folder must hold only what is yet to be read."""
    folder.mkdir(parents=True, exist_ok=True)
    reader = (spark.readStream.format("text")
              .option("wholetext", "true")
              .option("pathGlobFilter", glob)
              .option("maxFileAge", NO_MAXIMUM_AGE)
              .option("cleanSource", cleanup))
    if cleanup == "archive":
        if archive is None:
            raise ValueError("an archive folder is needed to archive landed files")
        archive.mkdir(parents=True, exist_ok=True)
        reader = reader.option("sourceArchiveDir", str(archive))
    if max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    return (reader.load(str(folder))
            .select("value", F.col("_metadata.file_path").alias("file_path")))
