"""Check every file of a prepared directory (the manifest, the file list and sizes, the CRC-32 of
every file): the library behind ``python -m etl.verify DIR``, and what a stage calls when a read
of its data fails (``naming_damaged_files``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prepared.errors import UsageError
from prepared.files import CHECKSUMS, FILES, is_data_file
from prepared.reader import open_prepared
from prepared.uri import filesystem, join


def verify(uri: str) -> dict:
    """Check every file of the prepared directory ``uri``; raises UsageError naming the first
    damaged one. Returns what was checked: ``{"files", "bytes", "crc32", "decoded"}``."""
    prep = open_prepared(uri)  # sizes, then the CRC-32 of every file that has one
    sizes, sums = prep.manifest[FILES], prep.manifest.get(CHECKSUMS, {})
    unsummed = [f for f in sorted(sizes) if f not in sums and is_data_file(f)
                and f.endswith(".parquet")]
    fs, path = filesystem(uri)
    for f in unsummed:
        decode(fs, join(path, f), f"--data {uri}: {f}")
    return {"files": len(sizes), "bytes": sum(sizes.values()),
            "crc32": sum(f in sizes for f in sums), "decoded": len(unsummed)}


def decode(fs, path: str, where: str) -> None:
    """Read the Parquet file ``path`` whole, every column of every row group."""
    import pyarrow.parquet as pq

    try:
        with fs.open_input_file(path) as f:
            pf = pq.ParquetFile(f)
            for g in range(pf.num_row_groups):
                pf.read_row_group(g)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid/ArrowIOError and kin
        raise UsageError(f"{where} is damaged: it does not read as Parquet ({first_line(e)}). "
                         "Copy the directory again from where it came from, or prepare it again "
                         "(etl/prepare.py --overwrite)") from None


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def is_read_error(e: BaseException) -> bool:
    """Whether ``e`` (possibly wrapped by Ray or Spark, which keep the cause's text) looks like a
    failed Parquet/Arrow read: worth checking the data's files for before reporting it."""
    text = f"{type(e).__name__}: {e}"
    return any(word in text for word in ("Arrow", "arquet", "thrift", "Thrift", "ZSTD",
                                         "decompress", "FAILED_READ_FILE"))


@contextlib.contextmanager
def naming_damaged_files(uri: str) -> Iterator[None]:
    """Around code that reads the prepared directory ``uri`` (Ray Data, Spark): a read failure
    becomes the one-line UsageError naming the damaged file, if a check of every file finds one
    (a cost paid only after a failure); any other failure passes through unchanged. Ray Data and
    Spark raise the failure from inside a task, as a traceback that names no file (pyarrow's
    errors do not say which file they were reading)."""
    try:
        yield
    except UsageError:
        raise
    except Exception as e:
        if not is_read_error(e):
            raise
        try:
            verify(uri)
        except UsageError as damaged:
            raise damaged from e
        raise
