"""The project's code as one zip for a cluster's executors (``spark.submit.pyFiles``, which
``spark-submit`` ships as ``--py-files``): whatever Python runs on an executor imports the
driver's own ``spark_jobs``, not whichever copy (or none) the executor's machine has.

Built from the installed package where it runs, named by a digest of its files, so a
changed checkout ships the change and an unchanged one reuses the zip.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

import spark_jobs

PACKAGE_DIR = Path(spark_jobs.__file__).resolve().parent
SHIPPED_SUFFIXES = (".py", ".toml")  # the code and its packaged defaults


def _files() -> list[Path]:
    return sorted(path for path in PACKAGE_DIR.rglob("*")
                  if path.suffix in SHIPPED_SUFFIXES and "__pycache__" not in path.parts)


def code_archive(folder: Path | None = None) -> Path:
    """The zip of ``spark_jobs`` (its modules at ``spark_jobs/…`` inside), made once per
    version of the code in ``folder`` (default: the temporary directory)."""
    files = _files()
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(PACKAGE_DIR)}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
                      .encode())
    folder = folder or Path(tempfile.gettempdir()) / "lakehouse-code"
    archive = folder / f"spark_jobs-{digest.hexdigest()[:16]}.zip"
    if archive.exists():
        return archive
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{archive.name}.{os.getpid()}.tmp"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zipped:
        for path in files:
            zipped.write(path, Path("spark_jobs") / path.relative_to(PACKAGE_DIR))
    os.replace(partial, archive)  # a reader sees the whole zip or none
    return archive
