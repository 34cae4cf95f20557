"""The experiment's results, published as one set beside its other folders: table.md, table.csv,
paired.csv and figures/, with their manifest results.json written last (``publish_results``),
checked by every reader (``read_results``).

The discipline is runtime/publish.py's: staged in a hidden sibling (``hidden_sibling``), a
manifest naming every file with its size (``prepared.files``' ``files``) written last, one
writer at a time (its ``WriterLock``, on the local disk), and the staging an interrupted writer
left removed by the next one, under the lock. Its ``Publisher`` moves a whole directory into
place; the results share EXPERIMENTS_DIR/NAME with trials/, final/, recs/ and evaluation/, so
they are moved in file by file and the manifest is what makes the set whole."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from experiment.records import read_json, write_json
from prepared.errors import UsageError
from prepared.files import FILES, check_files
from runtime.publish import WriterLock, hidden_sibling

RESULTS = "results.json"  # the results' manifest: written last, lists every file with its size
RESULT_FILES = ("table.md", "table.csv", "paired.csv", "figures")
LOCK = ".results.lock"  # beside the results: held while they are written


def publish_results(root: Path, files: dict[str, bytes]) -> None:
    """Write the results (``files``: relative path -> bytes) beside the experiment's other
    folders, so that no reader takes a mix of an earlier run's files and this one's for a result.

    Everything is written first into a hidden staging folder; the manifest ``results.json`` is
    removed, the files are moved in (``figures/`` whole, by one rename: no figure of an earlier
    run stays beside new ones), and the manifest, naming every file with its size, is written
    last. A reader checks it (``read_results``): between the first move and the manifest there
    is none, and a reader is told the results are being written. One writer at a time: the lock
    ``.results.lock`` (``runtime.publish.WriterLock``: a second writer is refused, told who holds
    it; a killed writer's is taken over), under which the staging folders of an interrupted
    writer (``.results.tmp-ID``, ``.figures.old-ID``) are removed first."""
    root.mkdir(parents=True, exist_ok=True)
    lock = WriterLock.local(str(root / LOCK), str(root))
    lock.acquire()
    try:
        for left in [*root.glob(".results.tmp-*"), *root.glob(".figures.old-*")]:
            shutil.rmtree(left, ignore_errors=True)  # only a holder of the lock gets here
        stage = Path(hidden_sibling(str(root / "results"), "tmp"))
        try:
            for name, data in files.items():
                (stage / name).parent.mkdir(parents=True, exist_ok=True)
                (stage / name).write_bytes(data)
            move_in(root, stage)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        write_json(root / RESULTS, {"written": time.strftime("%Y-%m-%d %H:%M:%S"),
                                    FILES: {k: len(v) for k, v in sorted(files.items())}})
    finally:
        lock.release()


def move_in(root: Path, stage: Path) -> None:
    """The staged results into ``root``, its manifest removed first: from here until
    ``publish_results`` writes the new one, ``root`` holds no complete results."""
    (root / RESULTS).unlink(missing_ok=True)
    old = Path(hidden_sibling(str(root / "figures"), "old"))
    if (root / "figures").exists():
        (root / "figures").rename(old)
    for name in RESULT_FILES:
        if (stage / name).exists():
            (stage / name).replace(root / name)
        elif name != "figures":  # an earlier run's file this run does not write (paired.csv)
            (root / name).unlink(missing_ok=True)
    shutil.rmtree(old, ignore_errors=True)


def read_results(root: Path) -> dict:
    """The results' manifest, once the files match it; refuses results being (re)written."""
    manifest = read_json(root / RESULTS)
    if manifest is None:
        raise UsageError(f"{root}: no {RESULTS}, so its results are incomplete: the experiment has "
                         "not finished, or is writing them right now; wait for it, or run it again "
                         "with the same --name")
    found = {n: (root / n).stat().st_size for n in RESULT_FILES if (root / n).is_file()}
    found |= {f"figures/{p.name}": p.stat().st_size for p in (root / "figures").glob("*")}
    check_files(str(root), manifest[FILES], found)
    return manifest
