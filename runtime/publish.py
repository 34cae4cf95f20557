"""Publishing a directory whole, through Hadoop's FileSystem API (local paths, hdfs://, s3a://).

What readers may rely on, on every file system (object stores included):

- **The manifest is written last and names every file with its size** (``"files": {relative
  path: bytes}``). A reader verifies it (``check_files``): a missing file, a file of another
  size, or a data file the manifest does not list means the output is incomplete, and the
  reader refuses it with a message saying so. The ETL's manifest also records each data file's
  CRC-32 (``"crc32"``, ``prepared/files.py``): a file damaged in place keeps its size, and
  only its checksum tells. A renamed directory on S3A is a copy made file by
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
where it is.

**One writer per output path at a time**: a job takes the lock ``.NAME.lock`` beside the output
before it touches anything (``lock``; on a local disk the ETL takes it before Spark starts,
``local_lock``), holds it until it has published or failed, and a second job
for the same path is refused, told which pid on which host holds it. Only the holder recovers, so
the staging directories it removes (``.NAME.tmp-ID``) are those of earlier, interrupted runs, never
a live writer's. A lock whose pid is dead on this host (a killed job) is stale and taken over; one
from another host cannot be checked from here, and its message says how to remove it. On a local
disk the lock is created with ``O_EXCL``; on other file systems with Hadoop's ``create`` without
overwrite, which is atomic on HDFS but only check-then-write on S3A (no rename or create there is
atomic): on an object store the lock stops a second job started by mistake, not a race to the
millisecond.

An existing output is replaced only when asked, and only if it is a previous output (it holds the
manifest) or empty: ``--overwrite`` must never delete someone's home directory.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlparse

from prepared.errors import UsageError
from prepared.files import CHECKSUMS, FILES, check_files, crc32_of_uri, is_data_file

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


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (one of another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# what a lock needs of a file system for one path: create(text) unless it exists (False then),
# read() (None if absent), delete()
FileOps = tuple[Callable[[str], bool], Callable[[], "str | None"], Callable[[], None]]


def local_ops(path: str) -> FileOps:
    """``FileOps`` on a local disk: ``O_EXCL`` creates."""
    def create(text: str) -> bool:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return True

    def read() -> str | None:
        try:
            with open(path) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def delete() -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    return create, read, delete


class WriterLock:
    """``.NAME.lock`` beside an output: who writes it now (pid, host, start time, a token).

    ``create(text)`` makes the lock file unless it exists (False then), ``read()`` returns its
    text (None if absent), ``delete()`` removes it: ``local`` on a local disk (``O_EXCL``), or the
    Publisher's Hadoop FileSystem. A lock of a pid that no longer runs on this host is stale (its
    job was killed) and taken over. One of this very process is an earlier publish of the same
    output that stopped between ``check_target`` and ``staging`` (an error in between; the CLIs
    run one job per process): taken over too.
    """

    def __init__(self, path: str, target: str, ops: Callable[[str], FileOps]):
        self.path, self.target = path, target
        self._ops = ops  # the (create, read, delete) of a path: the lock's and its takeover's
        self._create, self._read, self._delete = ops(path)
        self.token: str | None = None  # set while held

    @classmethod
    def local(cls, path: str, target: str) -> WriterLock:
        return cls(path, target, local_ops)

    def holder(self) -> dict | None:
        """The holder's record; None if there is no lock, {} if it is unreadable (being
        written, or its writer died while writing it)."""
        return self.holder_of(self._read())

    @staticmethod
    def holder_of(text: str | None) -> dict | None:
        if text is None:
            return None
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            return {}
        return record if isinstance(record, dict) else {}

    def acquire(self) -> None:
        """Hold the lock, or raise UsageError naming its holder and what to do."""
        if self.token is not None:
            return
        host, token = socket.gethostname(), uuid.uuid4().hex
        text = json.dumps({"pid": os.getpid(), "host": host, "token": token, "target": self.target,
                           "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")})
        for attempt in range(TAKEOVER_TRIES):
            if self._create(text):
                self.token = token
                _HELD[token] = self
                return
            seen = self._read()
            holder = self.holder_of(seen)
            if holder is None:  # released meanwhile
                continue
            pid = holder.get("pid")
            if holder.get("host") != host or not isinstance(pid, int) or (
                    pid != os.getpid() and pid_alive(pid)):
                raise UsageError(self.held_message(holder))
            if not self._take_over(seen, text):  # another taker is at it: look again soon
                time.sleep(0.01 * (attempt + 1))
                continue
            if pid != os.getpid():
                log.warning("taking over the stale lock %s: its writer, pid %d on %s (since %s), "
                            "no longer runs", self.path, pid, host, holder.get("started"))
        raise UsageError(self.held_message(self.holder() or {}))

    def _take_over(self, seen: str, text: str) -> bool:
        """Delete the stale lock, if it is still the one read (``seen``), while holding
        ``PATH.takeover``: two takers that both read the stale lock would otherwise both delete
        (the second one the first one's new lock) and both hold it. False: another taker holds
        the takeover (or its taker died holding it, in a window of microseconds)."""
        create, _, delete = self._ops(self.path + ".takeover")
        if not create(text):
            return False
        try:
            if self._read() == seen:
                self._delete()
        finally:
            delete()
        return True

    def held_message(self, holder: dict) -> str:
        if not holder:
            return (f"{self.target} is locked by {self.path}, which names no holder (its writer "
                    "is starting, or died while taking it); if no job is writing "
                    f"{self.target}, delete {self.path} and run again")
        return (f"{self.target} is being written by another job: pid {holder.get('pid')} on host "
                f"{holder.get('host')}, since {holder.get('started')} (lock {self.path}); wait "
                "for it to finish, or, if that job no longer runs, delete the lock and run again")

    def release(self) -> None:
        """Remove the lock if this holds it (and it is still its own: never a taker's)."""
        token, self.token = self.token, None
        if token is None:
            return
        _HELD.pop(token, None)
        if (self.holder() or {}).get("token") == token:
            self._delete()


TAKEOVER_TRIES = 50  # looks at a stale lock while other takers race for it (~13 s at most)

# the locks this process holds (by token), released at exit if a job stopped between taking one
# and publishing (an error in between); a killed process leaves its lock stale instead
_HELD: dict[str, WriterLock] = {}


@atexit.register
def _release_all() -> None:
    for lock in list(_HELD.values()):
        with contextlib.suppress(Exception):
            lock.release()


def local_lock(target: str) -> WriterLock | None:
    """``target``'s writer lock, the one ``Publisher`` takes, made without a JVM where ``target``
    is on the local disk (a path or a ``file:`` URI): a job takes it before it starts Spark, so a
    second writer of the same output is refused at once, not after the first one's 30-70 s of
    JVM and job start. None on other file systems (the Publisher takes its own lock there)."""
    if "://" in target and not target.startswith("file:"):
        return None
    path = urlparse(target).path if target.startswith("file:") else target
    path = os.path.abspath(os.path.expanduser(path)).rstrip("/")
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    return WriterLock.local(f"{parent}/.{name}.lock", qualify(target).rstrip("/"))


def failpoint(name: str) -> None:
    """Die here, as a kill would (no cleanup), when ``NCE_FAILPOINT`` names this point: how the
    tests interrupt a real job in each window of publishing."""
    if os.environ.get("NCE_FAILPOINT") == name:
        os._exit(137)


class Publisher:
    """Hadoop FileSystem operations on the JVM of a running SparkSession."""

    def __init__(self, spark, target: str, marker: str = "manifest.json",
                 lock: WriterLock | None = None):
        self.spark = spark
        self.target = qualify(target).rstrip("/")
        self.marker = marker
        jvm = spark.sparkContext._jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        self._fs = self._Path(self.target).getFileSystem(
            spark.sparkContext._jsc.hadoopConfiguration())
        self.tmp = hidden_sibling(self.target, "tmp")
        parent, name = self.target.rsplit("/", 1)
        self.lock_path = f"{parent}/.{name}.lock"
        # on a local disk: the lock's own path, used with os (O_EXCL; no JVM needed at exit)
        self._local = (self._Path(self.lock_path).toUri().getPath()
                       if self._fs.getUri().getScheme() == "file" else None)
        # ``lock``: the output's lock, already taken before Spark started (``local_lock``)
        self._lock = lock or self._writer_lock()

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
        stopped between its renames (or while copying the new one in), drop leftovers. Takes the
        lock first: a staging directory is a leftover only when no live writer holds the path."""
        self.lock()
        for tmp in self.siblings("tmp"):
            if tmp == self.tmp:
                continue
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
        """Take the lock and refuse to run when the result could not be published; called before
        any work. The lock is held until ``staging`` ends (or the process exits)."""
        try:
            self.recover()
            self._check_replaceable(overwrite)
        except BaseException:
            self.unlock()
            raise

    def _check_replaceable(self, overwrite: bool) -> None:
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

    def write_manifest(self, manifest: dict, checksums: dict[str, str] | None = None) -> dict:
        """The staged output's manifest, written last: ``manifest`` plus every file with its size.

        ``checksums``: the CRC-32s (``prepared.files``) the job computed as it wrote some files
        (the ETL's row shards: re-reading them would cost a pass over the largest output). With
        it, every other data file is read back here and its CRC-32 recorded too (Spark's writers
        give no hook; these are the smaller tables); without it the manifest lists sizes only.
        """
        files = dict(sorted(self.listing(self.tmp).items()))
        files.pop(self.marker, None)
        manifest = {**manifest, FILES: files}
        if checksums is not None:
            rest = [f for f in files if is_data_file(f) and f not in checksums]
            known = {f: checksums[f] for f in files if f in checksums}
            manifest[CHECKSUMS] = dict(sorted({**known, **self.checksums(rest)}.items()))
        failpoint("before-manifest")
        self.write_json(f"{self.tmp}/{self.marker}", manifest)
        return manifest

    def checksums(self, relative: list[str]) -> dict[str, str]:
        """CRC-32 of each staged file in ``relative``, read back by Spark tasks in parallel (the
        same pyarrow code that readers verify with)."""
        if not relative:
            return {}
        sc = self.spark.sparkContext
        tmp = self.tmp
        pairs = (sc.parallelize(relative, min(len(relative), 4 * sc.defaultParallelism))
                 .map(lambda f: (f, crc32_of_uri(f"{tmp}/{f}"))).collect())
        return dict(pairs)

    # -- the lock: one writer per output path (``WriterLock``) ------------------------------

    def _writer_lock(self) -> WriterLock:
        if self._local:
            return WriterLock.local(self._local, self.target)
        return WriterLock(self.lock_path, self.target, self._hadoop_ops)

    def _hadoop_ops(self, path: str) -> FileOps:
        """``FileOps`` on the Hadoop FileSystem (create without overwrite: HDFS and S3A refuse
        an existing file)."""
        def create(text: str) -> bool:
            try:
                stream = self._fs.create(self._Path(path), False)
            except Exception:  # py4j's wrapper of FileAlreadyExistsException (HDFS, S3A)
                if self.exists(path):
                    return False
                raise
            try:
                stream.write(bytearray(text.encode("utf-8")))
            finally:
                stream.close()
            return True

        return create, lambda: read_text(self.spark, path), lambda: self.delete(path)

    def lock(self) -> None:
        """Hold the output's lock (``WriterLock``), or refuse: another job is writing it."""
        self._fs.mkdirs(self._Path(self.target.rsplit("/", 1)[0]))
        self._lock.acquire()

    def unlock(self) -> None:
        self._lock.release()

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
        """Yield the temporary directory; delete it if the body fails, publish it if not; then
        release the lock (taken here if ``check_target`` did not)."""
        self.lock()
        try:
            try:
                yield self.tmp
            except BaseException:
                with contextlib.suppress(Exception):
                    self.delete(self.tmp)
                raise
            self.commit()
        finally:
            self.unlock()
