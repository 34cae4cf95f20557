"""Writing one file whole: through a hidden temporary sibling (``.NAME.tmp-PID``) and a rename, so
a reader sees the old file or the new one, never half of one, and a writer that dies part-way
leaves the old file (or none) and no temporary behind.

Local paths are written with ``open`` and ``os.replace``; URIs (``s3://``, ``hdfs://``, ...)
through pyarrow's file system for that scheme, whose ``move`` is the rename. (Whole directories
are published by ``runtime.publish``.)"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def temporary_sibling(path: str | Path, kind: str = "tmp") -> str:
    """``DIR/.NAME.KIND-PID``: hidden (Spark, pyarrow and ``ls`` skip it) and one per process."""
    parent, sep, name = str(path).rpartition("/")
    return f"{parent}{sep}.{name}.{kind}-{os.getpid()}"


@contextlib.contextmanager
def atomic_output(target: str | Path, kind: str = "tmp") -> Iterator[BinaryIO]:
    """A binary stream whose bytes become ``target`` (a local path or a URI) when the block ends
    without an exception; with one, the temporary is removed and ``target`` is left as it was."""
    target = str(target)
    if "://" not in target:
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_sibling(path, kind)
        try:
            with open(tmp, "wb") as f:
                yield f
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return
    from prepared.uri import filesystem  # pyarrow: only for URIs
    fs, path = filesystem(target)
    fs.create_dir(path.rpartition("/")[0], recursive=True)
    tmp = temporary_sibling(path, kind)
    try:
        with fs.open_output_stream(tmp) as f:
            yield f
        fs.move(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.delete_file(tmp)
        raise


def write_bytes(target: str | Path, data: bytes) -> None:
    """``data`` as ``target`` (local path or URI), written whole then renamed into place."""
    with atomic_output(target) as f:
        f.write(data)


def write_text(target: str | Path, text: str) -> None:
    """``text`` (UTF-8) as ``target``, written whole then renamed into place."""
    write_bytes(target, text.encode("utf-8"))
