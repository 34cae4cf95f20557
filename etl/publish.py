"""Atomic publishing of a directory through Hadoop's FileSystem API (local paths, hdfs://, s3a://).

A job writes into a hidden sibling ``.NAME.tmp-UUID`` and renames it to ``NAME`` at the very end,
after ``manifest.json`` (the completeness marker) is written inside it. A failed run deletes its
temporary directory; a killed one leaves only a hidden ``.tmp-`` sibling that no reader takes for
a dataset. An existing output is replaced only when asked, and only if it is a previous output
(it holds ``manifest.json``) or empty: ``--overwrite`` must never delete someone's home directory.

On object stores a rename is a copy, not atomic; the manifest-last rule still holds there.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator

from etl.errors import UsageError


def qualify(path: str) -> str:
    """An absolute local path or a URI, as Spark and Hadoop want it."""
    if "://" in path or path.startswith("file:"):
        return path
    return os.path.abspath(os.path.expanduser(path))


def read_text(spark, path: str) -> str | None:
    """A small text file through Hadoop's FileSystem (any scheme Spark reads); None if absent.
    (Spark's text readers skip names starting with '_' or '.', such as ``_manifest.json``.)"""
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(qualify(path))
    fs = p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(p):
        return None
    stream = fs.open(p)
    try:
        return jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()


class Publisher:
    """Hadoop FileSystem operations on the JVM of a running SparkSession."""

    def __init__(self, spark, target: str, marker: str = "manifest.json"):
        self.spark = spark
        self.target = qualify(target).rstrip("/")
        self.marker = marker
        jvm = spark.sparkContext._jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        self._fs = self._Path(self.target).getFileSystem(
            spark.sparkContext._jsc.hadoopConfiguration())
        parent, name = self.target.rsplit("/", 1)
        self.tmp = f"{parent}/.{name}.tmp-{uuid.uuid4().hex[:12]}"

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._Path(path)))

    def check_target(self, overwrite: bool) -> None:
        """Refuse to run when the result could not be published; called before any work."""
        if not self.exists(self.target):
            return
        if not overwrite:
            raise UsageError(f"{self.target} already exists; pass --overwrite to replace it, "
                             f"or choose another --output")
        listing = self._fs.listStatus(self._Path(self.target))
        if len(listing) and not self.exists(f"{self.target}/{self.marker}"):
            raise UsageError(f"{self.target} exists and is not a previous output (no {self.marker}); "
                             f"refusing to replace it even with --overwrite. Remove it yourself or "
                             f"choose another --output")

    def write_bytes(self, path: str, data: bytes) -> None:
        stream = self._fs.create(self._Path(path), True)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()

    def write_text(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode("utf-8"))

    def write_json(self, path: str, obj: dict) -> None:
        self.write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")

    def delete(self, path: str) -> None:
        if self.exists(path):
            self._fs.delete(self._Path(path), True)

    def commit(self) -> None:
        """Move the finished temporary directory into place (replacing a previous output)."""
        old = None
        if self.exists(self.target):
            old = self.target.rsplit("/", 1)
            old = f"{old[0]}/.{old[1]}.old-{uuid.uuid4().hex[:12]}"
            if not self._fs.rename(self._Path(self.target), self._Path(old)):
                raise OSError(f"could not move the previous {self.target} aside to {old}")
        if not self._fs.rename(self._Path(self.tmp), self._Path(self.target)):
            if old:  # put the previous output back rather than leave nothing
                self._fs.rename(self._Path(old), self._Path(self.target))
            raise OSError(f"could not rename {self.tmp} to {self.target}")
        if old:
            self.delete(old)

    @contextlib.contextmanager
    def staging(self) -> Iterator[str]:
        """Yield the temporary directory; delete it if the body fails, publish it if not."""
        try:
            yield self.tmp
        except BaseException:
            with contextlib.suppress(Exception):
                self.delete(self.tmp)
            raise
        self.commit()
