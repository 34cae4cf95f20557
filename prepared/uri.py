"""Where a stage's files are: a local path or a URI (``file:``, ``s3a://``, any scheme pyarrow
opens), as every reader and writer of the project addresses them.

    filesystem("var/data/ml-100k")          (LocalFileSystem, "/abs/var/data/ml-100k")
    filesystem("s3a://bucket/prepared")     (S3FileSystem, "bucket/prepared")
    join(base, "manifest.json")             base + "/" + name, for paths and URIs alike
    absolute("var/runs")                    "/abs/var/runs"; a URI unchanged

It imports nothing else of the project (``prepared/files.py`` and ``prepared/reader.py`` both use
it), and pyarrow only when a file system is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow.fs as pafs


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def absolute(uri: str) -> str:
    """A local path made absolute (what a run records, so that it is found from any directory);
    a URI as given."""
    return uri if "://" in uri else str(Path(uri).resolve())


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow FileSystem, path) of a local path or a URI (file:/x as Hadoop writes it, s3a://
    as s3://)."""
    import pyarrow.fs as pafs

    if "://" not in uri and not uri.startswith("file:"):
        return pafs.LocalFileSystem(), str(Path(uri).resolve())
    return pafs.FileSystem.from_uri(uri.replace("s3a://", "s3://", 1))
