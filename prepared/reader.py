"""A prepared directory (the ETL's output, ``prepared/schema.py``) as every later stage reads it.

Opening one checks that it is complete (its manifest and exactly the files the manifest lists, with
their sizes: ``prepared/files.py``), that every file is intact (its CRC-32, where the manifest
records one: the row shards too, whatever their size) and of the schema version this code reads,
and loads the small per-item tables (popularity, hence R* for any beta and the negative-sampling
distribution). User rows stay on storage: Ray Data streams them (``training/feed.py``).

Every stage (training, scoring, evaluation, an experiment) opens its data so before it reads a
row: a shard damaged in place keeps its size and usually still decodes, to other numbers (in 400
random one-byte flips of a real shard, 280 decoded without an error), so the checksum is the only
check that sees it. The files are read in ``VERIFY_THREADS`` threads (zlib's CRC and pyarrow's
reads release the GIL): at the Yahoo! Music shape that is a second or two of a stage's minutes
(``benchmarks/verify_cost.py``); over a remote file system it is one more read of the data, by
the driver.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow.dataset as pds
import pyarrow.fs as pafs

from prepared import protocol
from prepared import schema as S
from prepared.errors import UsageError
from prepared.files import CHECKSUMS, FILES, check_checksum, check_files, crc32_of, is_data_file
from prepared.uri import filesystem, join

VERIFY_THREADS = 4  # files checksummed at once on open: the disk's (or the network's) depth
TELL_ABOVE = 1 << 30  # bytes: an open that checks more says so (it takes a second or more)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    uri: str                 # as given (absolute local path or URI)
    manifest: dict
    pop_train: np.ndarray    # (n_items,) int64, warm users' training positives per item
    pop_train_valid: np.ndarray

    @property
    def n_items(self) -> int:
        return len(self.pop_train)

    @property
    def n_users(self) -> int:
        """User indices are 0..n_users-1, cold users included (schema.py)."""
        return int(self.manifest["counts"]["users"])

    @property
    def dataset(self) -> str:
        return self.manifest["dataset"]

    @property
    def rows_uri(self) -> str:
        return join(self.uri, self.manifest["layout"]["rows"])

    def row_shards(self) -> dict[str, str | None]:
        """The rows' Parquet files (name within the rows folder -> CRC-32, None where the
        manifest has none), from the manifest's list of files, which ``open_prepared`` checked
        against the directory: the files as they are, the unit scoring and evaluation pair."""
        folder = self.manifest["layout"]["rows"].rstrip("/") + "/"
        sums = self.manifest.get(CHECKSUMS, {})
        return {f[len(folder):]: sums.get(f) for f in sorted(self.manifest[FILES])
                if f.startswith(folder) and is_data_file(f)}

    def beta(self) -> float:
        return float(self.manifest["parameters"]["beta"])

    def rstar_table(self, beta: float, train_valid: bool) -> np.ndarray:
        """(n_items,) float32 R* of an observed entry of each item, for ``beta`` and the training
        splits (train+valid uses its own popularity, and Z = its positives in 'positives' mode)."""
        pop = self.pop_train_valid if train_valid else self.pop_train
        # the same rule as the ETL's; Z counts the users, or the positives of these splits
        z = protocol.rstar_z(self.manifest["parameters"]["rstar_z"],
                             self.manifest["counts"]["warm_users"], int(pop.sum()))
        return protocol.rstar_per_item(pop, z, beta).astype(np.float32)

    def user_overlap(self, train_valid: bool) -> float:
        """omega of the training splits' warm users (``protocol.user_overlap``): the unit of the
        AutoRec family's lambda under ``--lam-units overlap``."""
        pop = self.pop_train_valid if train_valid else self.pop_train
        return protocol.user_overlap(pop, int(self.manifest["counts"]["warm_users"]))

    def rstar_is_stored(self, beta: float | None, train_valid: bool) -> bool:
        return not train_valid and (beta is None or beta == self.beta())

    def negatives(self) -> int:
        return int(self.manifest["parameters"]["negatives"])

    def item_ids(self) -> list[str]:
        """The dataset's item ids in index order (the id map a logged model carries)."""
        fs, path = filesystem(self.uri)
        items = pds.dataset(join(path, self.manifest["layout"]["items"]), filesystem=fs,
                            format="parquet").to_table(columns=[S.ITEM_INDEX, S.ITEM_ID])
        order = np.argsort(items.column(S.ITEM_INDEX).to_numpy())
        return [str(v) for v in np.asarray(items.column(S.ITEM_ID).to_pylist(), object)[order]]


def verify_files(where: str, fs: pafs.FileSystem, path: str, manifest: dict) -> int:
    """Check the CRC-32 of every file the manifest records one for, ``VERIFY_THREADS`` at a
    time; returns how many were checked. The first damaged file in name order is the one named.
    Call after ``check_files`` (sizes)."""
    sizes, sums = manifest[FILES], manifest.get(CHECKSUMS, {})
    chosen = [f for f in sorted(sums) if f in sizes]
    total, t0 = sum(sizes[f] for f in chosen), time.perf_counter()
    with ThreadPoolExecutor(max(1, min(VERIFY_THREADS, len(chosen)))) as pool:
        found = list(pool.map(lambda f: crc32_of(fs, join(path, f)), chosen))
    for f, actual in zip(chosen, found):
        check_checksum(where, f, sums[f], actual)
    if total > TELL_ABOVE:
        log.info("%s: %d files intact (%.1f GiB by CRC-32 in %.1f s)", where, len(chosen),
                 total / 2**30, time.perf_counter() - t0)
    return len(chosen)


RAW_SUFFIXES = (".csv", ".tsv", ".dat", ".txt", ".data", ".json", ".zip", ".gz")


def raw_files(fs: pafs.FileSystem, path: str, shown: int = 3) -> list[str]:
    """The first few files directly in ``path`` that look like a raw dataset's (text ratings,
    an archive), by name: a prepared directory holds Parquet and a manifest, never these."""
    names = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(path)) if i.is_file)
    return [n for n in names if n.lower().endswith(RAW_SUFFIXES)
            and not n.lower().startswith(("readme", "notice", "license"))][:shown]


def open_prepared(uri: str) -> Prepared:
    """Check ``uri`` is a complete, intact prepared directory of this schema version (every
    file's size and CRC-32) and load its items."""
    fs, path = filesystem(uri)
    info = fs.get_file_info(path)
    hint = ("prepare one with: spark-submit etl/prepare.py --dataset NAME --input RAW --output "
            f"{uri}")
    if info.type == pafs.FileType.NotFound:
        parent, name = path.rsplit("/", 1)
        aside = [i.path for i in fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True))
                 if i.base_name.startswith(f".{name}.old-")]
        if aside:
            raise UsageError(f"--data {uri}: an overwrite of it was interrupted; the previous "
                             f"output is whole in {aside[0]}, and the next etl/prepare.py run for "
                             f"this --output restores it first")
        raise UsageError(f"--data {uri}: no such directory; {hint}")
    if info.type != pafs.FileType.Directory:
        raise UsageError(f"--data {uri}: not a directory; pass the ETL's --output directory")
    manifest_path = join(path, S.MANIFEST)
    if fs.get_file_info(manifest_path).type == pafs.FileType.NotFound:
        raw = raw_files(fs, path)
        if raw:  # the raw dataset itself: prepare it, into its own place (never into the raw folder)
            name = path.rstrip("/").rsplit("/", 1)[-1]
            raise UsageError(
                f"--data {uri}: a raw dataset ({', '.join(raw)}), not a prepared one; prepare it "
                f"with: spark-submit etl/prepare.py --dataset NAME --input {uri} --output "
                f"var/data/{name}, then pass --data var/data/{name}")
        raise UsageError(f"--data {uri}: not a prepared dataset (no {S.MANIFEST}, which the ETL "
                         f"writes last: the directory is another kind or a half-written one); {hint}")
    with fs.open_input_stream(manifest_path) as f:
        try:
            manifest = json.loads(f.read())
        except json.JSONDecodeError as e:
            raise UsageError(f"{uri}/{S.MANIFEST}: not valid JSON ({e}); prepare it again: {hint}") from None
    version = manifest.get("schema_version")
    if version != S.SCHEMA_VERSION:
        raise UsageError(f"--data {uri}: schema version {version}, but this code reads version "
                         f"{S.SCHEMA_VERSION}; prepare it again with this code's etl/prepare.py")
    found = {i.path[len(path):].lstrip("/"): i.size
             for i in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if i.is_file}
    found.pop(S.MANIFEST, None)
    check_files(f"--data {uri}", manifest[FILES], found)
    verify_files(f"--data {uri}", fs, path, manifest)
    items = pds.dataset(join(path, manifest["layout"]["items"]), filesystem=fs,
                        format="parquet").to_table(columns=[S.ITEM_INDEX, S.POP_TRAIN,
                                                            S.POP_TRAIN_VALID])
    order = np.argsort(items.column(S.ITEM_INDEX).to_numpy())
    if not np.array_equal(items.column(S.ITEM_INDEX).to_numpy()[order], np.arange(len(order))):
        raise UsageError(f"--data {uri}: items/ does not hold item indices 0..n-1; prepare it again")
    return Prepared(uri=uri, manifest=manifest,
                    pop_train=items.column(S.POP_TRAIN).to_numpy()[order].astype(np.int64),
                    pop_train_valid=items.column(S.POP_TRAIN_VALID).to_numpy()[order].astype(np.int64))
