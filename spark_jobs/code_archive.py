"""The project's code as one zip for a cluster's executors (``spark.submit.pyFiles``, which
``spark-submit`` ships as ``--py-files``): whatever Python runs on an executor imports the
driver's own ``spark_jobs``, not whichever copy (or none) the executor's machine has.

Built from the installed package where the job starts, its package data included (the
defaults, the report's templates), named by a digest of its files' content: a changed
checkout ships the change and an unchanged one reuses the zip. A driver that itself runs
from the shipped zip (spark-submit puts it first on the driver's path) ships that zip.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import zipfile
from pathlib import Path

import spark_jobs

PACKAGE_FILE = Path(spark_jobs.__file__)


def _running_from_zip() -> Path | None:
    """The zip this package was imported from, if it was."""
    for parent in PACKAGE_FILE.parents:
        if parent.suffix == ".zip" and parent.is_file():
            return parent
    return None


def _files(package_dir: Path) -> list[Path]:
    return sorted(path for path in package_dir.rglob("*")
                  if path.is_file() and "__pycache__" not in path.parts
                  and path.suffix != ".pyc")


def _private_folder() -> Path:
    """This user's own folder for the zips, readable by nobody else: a zip planted in a
    shared temporary folder under the expected name would otherwise run as our code."""
    folder = Path(tempfile.gettempdir()) / f"lakehouse-code-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.lstat()
    if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
            or info.st_mode & 0o077):
        raise PermissionError(f"{folder} is not a private folder of this user: remove it")
    return folder


def code_archive(folder: Path | None = None) -> Path:
    """The zip of ``spark_jobs`` (its files at ``spark_jobs/…`` inside), made once per
    version of the code in ``folder`` (default: a private folder of this user)."""
    if shipped := _running_from_zip():
        return shipped
    package_dir = PACKAGE_FILE.resolve().parent
    files = _files(package_dir)
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(package_dir)}\0".encode())
        digest.update(path.read_bytes())
    folder = folder or _private_folder()
    archive = folder / f"spark_jobs-{digest.hexdigest()[:16]}.zip"
    if archive.exists():
        return archive
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{archive.name}.{os.getpid()}.tmp"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zipped:
        for path in files:
            zipped.write(path, Path("spark_jobs") / path.relative_to(package_dir))
    os.replace(partial, archive)  # a reader sees the whole zip or none
    return archive
