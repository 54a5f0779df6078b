"""The landing zone as a stream source: every file read whole, once, however old it is."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

from pyspark.sql import functions as F

from spark_jobs import storage
from spark_jobs.delta_writes import committed_source_offset

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

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


def clean_read_files(folder: Path, checkpoint: Path, cleanup: str, archive: Path) -> int:
    """Archive (or delete) the files of ``folder`` that the file source checkpointed at
    ``checkpoint`` read in a committed batch but left behind; how many.

    Spark cleans a batch's files when the stream plans its next batch, on a thread of its
    own and at best effort: a driver killed in between, a lake that was ingesting before
    files were cleaned, or a file read under a later batch than its own leave files Spark
    never cleans, which every trigger would list again. A stream's start sweeps them, from
    the source's own log (each file it read: path, modification time, the batch that read
    it), up to the batch before its last committed one: Spark itself cleans that one's
    files when it plans the next. A file whose modification time is not the one the log
    holds is another file under a name already read, which the source will never read
    (it remembers paths): it stays, with a warning. Best effort too: a file that cannot be
    moved, or a checkpoint this cannot read, is logged and the stream starts regardless."""
    if cleanup == "off" or storage.is_object_store(folder) or not folder.is_dir():
        # On an object store Spark's own cleaner archives what the batches read; sweeping
        # up after it there is not built (object-store roots are new: issue 18).
        return 0
    waiting = sorted(folder.iterdir())
    if not waiting:
        return 0  # the source's log, a path per file ever read, is read only when needed
    try:
        position = committed_source_offset(str(checkpoint))
        if position is None:
            return 0
        read = _read_by_source(checkpoint / "sources" / "0",
                               {path.name for path in waiting}, position["logOffset"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("not sweeping %s: its stream's checkpoint could not be read (%s)",
                    folder, error)
        return 0
    swept = 0
    for path in waiting:
        modified = read.get(str(path))  # the folder as the stream lists it
        if modified is None:  # not read, or read by the last committed batch or later
            continue
        try:
            if modified != path.stat().st_mtime_ns // 1_000_000:
                log.warning("%s was delivered again under a name already read: it is not "
                            "read again (deliver new data under a new name)", path)
                continue
            if cleanup == "delete":
                path.unlink(missing_ok=True)
            else:
                target = archive / str(path).lstrip("/")  # where Spark archives it
                if target.exists():  # a name used again: keep both, leave this one
                    log.warning("not archiving %s: %s exists", path, target)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(path, target)  # a copy where the archive is another mount
        except OSError as error:
            log.warning("could not sweep %s: %s", path, error)
            continue
        swept += 1
    if swept:
        log.info("swept %d read file(s) out of %s", swept, folder)
    return swept


def _read_by_source(source_log: Path, names: set[str], before_offset: int
                    ) -> dict[str, int]:
    """From a file source's log, the files named in ``names`` that a source offset before
    ``before_offset`` read: local path to modification time (epoch ms). The latest
    compaction holds every earlier entry, the offsets after it their own; lines are read
    one at a time, and only those ending in a wanted name are decoded (a month of a file a
    second is millions)."""
    if not source_log.is_dir():
        return {}
    entries = [entry.name for entry in source_log.iterdir() if not entry.name.startswith(".")]
    compactions = [int(name.removesuffix(".compact")) for name in entries
                   if name.endswith(".compact")]
    start = max(compactions, default=-1)
    files = ([source_log / f"{start}.compact"] if start >= 0 else []) + [
        source_log / name for name in sorted((n for n in entries if n.isdigit()), key=int)
        if start < int(name) < before_offset]
    read: dict[str, int] = {}
    for log_file in files:
        with log_file.open(encoding="utf-8") as lines:
            next(lines, None)  # its version line
            for line in lines:
                # {"path":"file:///…/name","timestamp":…,"batchId":…}: the name is the path's
                # last segment, percent-encoded.
                end = line.find('","timestamp"')
                if end >= 0 and unquote(line[line.rfind("/", 0, end) + 1:end]) not in names:
                    continue
                if not line.strip():
                    continue
                entry = json.loads(line)
                if int(entry["batchId"]) < before_offset:
                    read[url2pathname(urlparse(entry["path"]).path)] = int(entry["timestamp"])
    return read
