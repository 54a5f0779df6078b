"""Where the lakehouse's own files live: a local folder or an object store, behind one path
type, for the files the project reads and writes itself (Delta's log read without Spark,
heartbeats, reports, the landing zone). Spark and Delta reach the same places through
Hadoop's file systems (``session``).

A local location is a ``pathlib.Path``, as before. An ``s3a://bucket/key`` location (the
scheme Hadoop's S3A connector and Spark use) is a ``universal_pathlib`` path over fsspec,
served by PyArrow's S3 client, with the same methods (``/``, ``read_text``, ``open``,
``exists``, ``iterdir``, ``glob``, ``rename``, ``unlink``). PyArrow's client, not s3fs: s3fs
needs botocore, which needs python-dateutil 2, where Airflow pins 4. Delta tables are read
with delta-rs, given the same store (``delta_rs_options``).

The store is the one the settings name (``s3_endpoint``: empty for AWS's own), taken when
they are loaded (``configure``); credentials come from the AWS SDK's chain (environment,
profile, instance role), never from settings.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import urllib.parse
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from upath import UPath

    LakePath = Path | UPath  # a location on local disk or on the object store

OBJECT_STORE_SCHEME = "s3a"
# Regions S3-compatible stores answer to whatever they are asked (MinIO's and moto's).
STORE_REGION = "us-east-1"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")

_endpoint = ""  # the store of this process's settings: empty for AWS's own


def configure(endpoint: str) -> None:
    """The object store of this process: its settings' ``s3_endpoint``."""
    global _endpoint
    _endpoint = endpoint


def is_object_store(location: str | os.PathLike[str]) -> bool:
    found = _SCHEME.match(str(location))
    return found is not None and found[1].lower() == OBJECT_STORE_SCHEME


def lake_path(location: str | os.PathLike[str], *, endpoint: str | None = None) -> LakePath:
    """``location`` as a path: local (pathlib), or on the object store (``s3a://``) at
    ``endpoint`` (default: the one configured)."""
    if isinstance(location, Path) or not is_object_store(location):
        return Path(location)
    from upath import UPath

    _register()
    return UPath(str(location), endpoint=_endpoint if endpoint is None else endpoint)


def delta_rs_options() -> dict[str, str]:
    """delta-rs's storage options for the store: its endpoint, if not AWS's own (the
    credentials it finds in the same chain as S3A)."""
    if not _endpoint:
        return {}
    return {"AWS_ENDPOINT_URL": _endpoint, "AWS_REGION": STORE_REGION,
            "AWS_ALLOW_HTTP": str(_endpoint.startswith("http:")).lower()}


_registered = False


def _register() -> None:
    """fsspec's ``s3a`` protocol, served by PyArrow (registered once, on first use)."""
    global _registered
    if _registered:
        return
    import fsspec
    from fsspec.implementations.arrow import ArrowFSWrapper

    class S3AFileSystem(ArrowFSWrapper):
        protocol = (OBJECT_STORE_SCHEME,)

        def __init__(self, endpoint: str = "", **kwargs: Any) -> None:
            import pyarrow.fs

            options: dict[str, Any] = {}
            if endpoint:
                address = urllib.parse.urlsplit(endpoint)
                options = {"endpoint_override": address.netloc, "scheme": address.scheme,
                           "region": STORE_REGION}
            super().__init__(pyarrow.fs.S3FileSystem(**options), **kwargs)

        @classmethod
        def _strip_protocol(cls, path: str | list[str]) -> Any:
            if isinstance(path, list):
                return [cls._strip_protocol(each) for each in path]
            text = str(path)
            if is_object_store(text):
                text = text.split("://", 1)[1]
            return text.rstrip("/")

        @classmethod
        def _parent(cls, path: str) -> str:  # fsspec's is a class method; PyArrow's is not
            stripped = cls._strip_protocol(path)
            return stripped.rsplit("/", 1)[0] if "/" in stripped else ""

    fsspec.register_implementation(OBJECT_STORE_SCHEME, S3AFileSystem, clobber=True)
    _registered = True


def replace(staged: LakePath, final: LakePath) -> None:
    """``staged`` becomes ``final`` whole or not at all: a rename on local disk; on the
    object store, where an object appears whole when written, a copy and a delete."""
    if isinstance(staged, Path):
        os.replace(staged, final)
    elif staged.is_dir():  # the store copies objects one by one: no folder moves whole
        raise IsADirectoryError(f"{staged}: a folder on the object store cannot be moved")
    else:
        staged.rename(final)


def write_atomically(directory: LakePath, name: str, content: bytes) -> LakePath:
    """Write under a hidden name, then rename: readers see the whole file or nothing."""
    directory.mkdir(parents=True, exist_ok=True)
    hidden = directory / f".{name}.tmp"
    hidden.write_bytes(content)
    final = directory / name
    replace(hidden, final)
    return final


def remove_tree(location: LakePath) -> None:
    """``location`` and everything under it, if it exists."""
    if isinstance(location, Path):
        shutil.rmtree(location, ignore_errors=True)
    elif location.exists():
        location.fs.rm(location.path, recursive=True)


def probe_writable(folder: LakePath) -> None:
    """Raise ``OSError`` unless a file can be written under ``folder`` (a probe of this
    process's own, removed again)."""
    if isinstance(folder, Path):
        folder.mkdir(parents=True, exist_ok=True)
        # A probe of its own: commands started together (a stream and a reprocess beside
        # it) each removed the other's shared one, and one of them refused the root.
        with tempfile.TemporaryFile(dir=folder, prefix=".write-probe-"):
            return
    probe = folder / f".write-probe-{uuid.uuid4().hex}"
    probe.write_bytes(b"")
    probe.unlink()


def upload_tree(local: Path, target: LakePath) -> None:
    """Every file under the local folder ``local`` written under ``target`` by its relative
    path (replacing what is there)."""
    for path in sorted(local.rglob("*")):
        if path.is_file():
            copy = target / path.relative_to(local).as_posix()
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(path.read_bytes())
