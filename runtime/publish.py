"""Publishing a directory whole, through Hadoop's FileSystem API (local paths, hdfs://, s3a://).

What readers may rely on, on every file system (object stores included):

- **The manifest is written last and names every file with its size** (``"files": {relative
  path: bytes}``). A reader verifies it (``check_files``): a missing file, a file of another
  size, or a data file the manifest does not list means the output is incomplete, and the
  reader refuses it with a message saying so. A renamed directory on S3A is a copy made file by
  file in no fixed order, so the manifest can appear before the data: the check is what makes
  that harmless. The row shards, written by pyarrow inside Spark tasks (outside Spark's output
  committer), are covered the same way.
- **A job writes into a hidden sibling** ``.NAME.tmp-ID`` and moves it into place at the end.
  Spark and pyarrow skip names starting with ``.``, so no reader takes it for an output.

Replacing an output (``--overwrite``) takes two renames: the old output is moved aside to
``.NAME.old-ID``, then the new one into place, then the old one is deleted. **Between the two
renames the path holds no complete output** (an instant on a local disk or HDFS; the length of the
copy on S3). A job killed there leaves the previous output whole in ``.NAME.old-ID``; the next run
for the same path restores it before anything else (``recover``), and a reader in between says
where it is. One writer per output path at a time: a run removes the staging directories that
earlier, interrupted runs left behind.

An existing output is replaced only when asked, and only if it is a previous output (it holds the
manifest) or empty: ``--overwrite`` must never delete someone's home directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from collections.abc import Iterator

from prepared.errors import UsageError
from prepared.files import FILES, check_files

log = logging.getLogger("etl")

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


def hidden_sibling(target: str, kind: str) -> str:
    parent, name = target.rsplit("/", 1)
    return f"{parent}/.{name}.{kind}-{uuid.uuid4().hex[:12]}"


def failpoint(name: str) -> None:
    """Die here, as a kill would (no cleanup), when ``NCE_FAILPOINT`` names this point: how the
    tests interrupt a real job in each window of publishing."""
    if os.environ.get("NCE_FAILPOINT") == name:
        os._exit(137)


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
        self.tmp = hidden_sibling(self.target, "tmp")

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._Path(path)))

    def listing(self, folder: str) -> dict[str, int]:
        """Every file under ``folder``: path relative to it -> bytes."""
        base = self._fs.makeQualified(self._Path(folder)).toUri().getPath().rstrip("/")
        found, it = {}, self._fs.listFiles(self._Path(folder), True)
        while it.hasNext():
            status = it.next()
            path = status.getPath().toUri().getPath()
            found[path[len(base) + 1:]] = int(status.getLen())
        return found

    def verify(self, folder: str, manifest: dict, where: str | None = None) -> None:
        """Refuse ``folder`` unless it holds exactly the files ``manifest`` lists (``check_files``)."""
        found = self.listing(folder)
        found.pop(self.marker, None)
        check_files(where or folder, manifest[FILES], found)

    def complete(self, folder: str) -> bool:
        """Whether ``folder`` holds a whole output: a readable manifest and the files it lists."""
        try:
            self.verify(folder, json.loads(read_text(self.spark, f"{folder}/{self.marker}") or "null"))
            return True
        except Exception:  # no manifest, unreadable, an older one without files, or incomplete
            return False

    def siblings(self, kind: str) -> list[str]:
        parent, name = self.target.rsplit("/", 1)
        if not self.exists(parent):
            return []
        prefix = f".{name}.{kind}-"
        return [f"{parent}/{s.getPath().getName()}" for s in self._fs.listStatus(self._Path(parent))
                if s.getPath().getName().startswith(prefix)]

    def recover(self) -> None:
        """Undo what an interrupted earlier run left: restore the previous output if an overwrite
        stopped between its renames (or while copying the new one in), drop leftovers."""
        for tmp in self.siblings("tmp"):
            log.info("removing %s, left by an interrupted run", tmp)
            self.delete(tmp)
        olds = self.siblings("old")
        if not olds:
            return
        if not self.complete(self.target):
            whole = [old for old in olds if self.complete(old)]
            if whole:
                self.delete(self.target)
                self._rename(whole[0], self.target)
                olds.remove(whole[0])
                log.warning("restored the previous %s from %s: an earlier overwrite was "
                            "interrupted before the new output was in place", self.target, whole[0])
        for old in olds:
            self.delete(old)

    def check_target(self, overwrite: bool) -> None:
        """Refuse to run when the result could not be published; called before any work."""
        self.recover()
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

    def write_manifest(self, manifest: dict) -> dict:
        """The staged output's manifest, written last: ``manifest`` plus every file with its size."""
        manifest = {**manifest, FILES: dict(sorted(self.listing(self.tmp).items()))}
        manifest[FILES].pop(self.marker, None)
        failpoint("before-manifest")
        self.write_json(f"{self.tmp}/{self.marker}", manifest)
        return manifest

    def delete(self, path: str) -> None:
        if self.exists(path):
            self._fs.delete(self._Path(path), True)

    def _rename(self, src: str, dst: str) -> None:
        if not self._fs.rename(self._Path(src), self._Path(dst)):
            raise OSError(f"could not rename {src} to {dst}")

    def commit(self) -> None:
        """Move the finished staging directory into place (replacing a previous output)."""
        failpoint("staged")
        old = None
        if self.exists(self.target):
            old = hidden_sibling(self.target, "old")
            self._rename(self.target, old)
            failpoint("moved-aside")
        try:
            self._rename(self.tmp, self.target)
        except OSError:
            if old:  # put the previous output back rather than leave nothing
                self._rename(old, self.target)
            raise
        failpoint("published")
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
