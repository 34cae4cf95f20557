"""What makes an output complete, for every reader: its manifest, written last, lists every file
with its size (``FILES``), and a reader refuses a directory whose files differ from that list
(``check_files``). The writers' side, publishing atomically on any file system, is
``runtime/publish.py``."""

from __future__ import annotations

from prepared.errors import UsageError

FILES = "files"  # the manifest's key listing every file of the output with its size


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
