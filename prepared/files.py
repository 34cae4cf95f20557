"""What makes an output complete, for every reader: its manifest, written last, lists every file
with its size (``FILES``), and a reader refuses a directory whose files differ from that list
(``check_files``). The writers' side, publishing atomically on any file system, is
``runtime/publish.py``.

The ETL's manifest also records each data file's CRC-32 (``CHECKSUMS``): a shard damaged in place
(a bad disk, a copy gone wrong) keeps its size, and without a checksum it passes every check until
a Ray Data or Spark task fails inside pyarrow with a traceback. CRC-32 (zlib's, the polynomial of
gzip and Java's ``CRC32``) because it is in Python's standard library and runs at GB/s: the aim is
to catch accidental damage, not tampering, for which a cryptographic hash would be needed (and
would cost several times more to check). Manifests written before checksums (no ``CHECKSUMS``
key) stay readable: their files are checked by size only.
"""

from __future__ import annotations

import zlib

from prepared.errors import UsageError
from prepared.uri import filesystem

FILES = "files"  # the manifest's key listing every file of the output with its size
CHECKSUMS = "crc32"  # the manifest's key: data file -> CRC-32 as 8 hex digits (ETL outputs)
CHUNK = 8 << 20  # bytes read at a time while checksumming


def is_data_file(relative: str) -> bool:
    """Whether readers would read this file: Spark and pyarrow skip names (and folders) starting
    with '_' or '.' (``_SUCCESS``, ``_manifest.json``, ``.part-0.crc``)."""
    return not any(part.startswith(("_", ".")) for part in relative.split("/"))


def check_files(where: str, listed: dict[str, int], found: dict[str, int]) -> None:
    """Refuse an output whose files differ from its manifest's list: ``listed`` is the manifest's
    ``files``, ``found`` what the directory holds (relative path -> bytes)."""
    missing = sorted(set(listed) - set(found))
    resized = sorted(f for f in set(listed) & set(found) if listed[f] != found[f])
    extra = sorted(f for f in set(found) - set(listed) if is_data_file(f))
    if not (missing or resized or extra):
        return
    said = []
    if missing:
        said.append(f"{len(missing)} file(s) its manifest lists are missing (e.g. {missing[0]})")
    if resized:
        f = resized[0]
        said.append(f"{len(resized)} file(s) differ in size (e.g. {f}: {found[f]:,} bytes, the "
                    f"manifest says {listed[f]:,})")
    if extra:
        said.append(f"{len(extra)} data file(s) are not in its manifest (e.g. {extra[0]})")
    raise UsageError(f"{where} is incomplete: {'; '.join(said)}. It is being written or copied "
                     "right now, or its writer was interrupted; wait for it, or run the job that "
                     "writes it again (with --overwrite)")


def crc32_hex(value: int) -> str:
    return f"{value & 0xFFFFFFFF:08x}"


class Crc32Sink:
    """A writable file for pyarrow that passes every byte on to ``stream`` and keeps their CRC-32
    (this module's): the shard's checksum for the manifest without reading it back."""

    def __init__(self, stream):
        self.stream, self.crc = stream, 0

    def write(self, data) -> int:
        self.crc = zlib.crc32(data, self.crc)
        return self.stream.write(data)

    def flush(self) -> None:
        self.stream.flush()

    def tell(self) -> int:
        return self.stream.tell()

    def close(self) -> None:
        self.stream.close()

    @property
    def closed(self) -> bool:
        return self.stream.closed


def crc32_of(fs, path: str) -> str:
    """CRC-32 of the file ``path`` on pyarrow FileSystem ``fs``, read in chunks."""
    crc = 0
    with fs.open_input_stream(path) as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc32_hex(crc)


def crc32_of_uri(uri: str) -> str:
    """CRC-32 of the file at ``uri`` (a local path, or any URI pyarrow opens; s3a:// as s3://)."""
    fs, path = filesystem(uri)
    return crc32_of(fs, path)


def check_checksum(where: str, relative: str, listed: str, actual: str) -> None:
    """Refuse a file whose CRC-32 differs from its manifest's (sizes were checked before)."""
    if listed != actual:
        raise UsageError(f"{where}: {relative} is corrupt: its CRC-32 is {actual}, its manifest "
                         f"says {listed} (same size: damaged on disk or in a copy). Copy the "
                         "directory again from where it came from, or run the job that writes it "
                         "again (with --overwrite)")
