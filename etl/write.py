"""The ETL's writes of a prepared directory (``prepared.schema``): the user rows and the split table
in one pass over the partitions' lists (``etl.pipeline.Work``), written by pyarrow from the
workers, and the small items and users tables."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from etl import passes
from etl.config import ETLConfig
from etl.pipeline import Work, as_str, kept_positives
from prepared import protocol
from prepared import schema as S
from prepared.files import Crc32Sink, crc32_hex
from prepared.uri import filesystem

ROWS_SCHEMA = pa.schema([
    (S.USER_INDEX, pa.int32()), (S.USER_ID, pa.string()), (S.COLD, pa.bool_()),
    (S.TRAIN_ITEMS, pa.list_(pa.int32())), (S.TRAIN_RSTAR, pa.list_(pa.float32())),
    (S.VALID_ITEMS, pa.list_(pa.int32())), (S.TEST_ITEMS, pa.list_(pa.int32())),
    (S.NEG_ITEMS, pa.list_(pa.int32())), (S.NEG_COUNTS, pa.list_(pa.int32())),
])


def build_rows(batch: pa.RecordBatch, rstar_item: np.ndarray, pop: np.ndarray, negatives: int,
               seed: int, table) -> pa.RecordBatch:
    """User rows from one user's-rows-contiguous batch of positives.

    ``batch``: ``user_index, user_id, cold, item_index, split_code`` (0 train, 1 valid, 2 test) with
    each user's positives adjacent. Lists come out ascending by item index; R* is gathered per
    training item; warm users get their negative-sample counts, cold users none.
    """
    user = batch.column("user_index").to_numpy(zero_copy_only=False)
    item = batch.column("item_index").to_numpy(zero_copy_only=False)
    code = batch.column("split_code").to_numpy(zero_copy_only=False).astype(np.int64)
    first = np.flatnonzero(np.concatenate([[True], user[1:] != user[:-1]]))
    n_users = len(first)
    owner = np.repeat(np.arange(n_users), np.diff(np.append(first, len(user))))
    order = passes.lexorder(owner, code, item)  # by user, then split, then item
    item, code, owner = item[order], code[order], owner[order]
    per = np.bincount(owner * 3 + code, minlength=n_users * 3).reshape(n_users, 3)
    start = np.zeros(n_users * 3 + 1, np.int64)
    np.cumsum(per.ravel(), out=start[1:])
    lists = []
    for c in range(3):
        # positions of split c: for user u, [start[3u + c], start[3u + c + 1])
        lo, hi = start[np.arange(n_users) * 3 + c], start[np.arange(n_users) * 3 + c + 1]
        lists.append((passes.offsets(hi - lo), item[_ranges(lo, hi)].astype(np.int32)))
    users = user[first]
    cold = batch.column("cold").to_numpy(zero_copy_only=False)[first]
    warm = np.flatnonzero(~cold)
    off, neg_items, neg_counts = protocol.negative_counts(users[warm], pop, negatives, seed, table)
    per_user = np.zeros(n_users, np.int64)
    per_user[warm] = np.diff(off)
    neg_off = passes.offsets(per_user)
    train_off, train_items = lists[0]
    return pa.RecordBatch.from_arrays(
        [pa.array(users, pa.int32()), batch.column("user_id").take(pa.array(first)),
         pa.array(cold, pa.bool_()),
         pa.ListArray.from_arrays(train_off, pa.array(train_items)),
         pa.ListArray.from_arrays(train_off, pa.array(rstar_item[train_items].astype(np.float32))),
         pa.ListArray.from_arrays(lists[1][0], pa.array(lists[1][1])),
         pa.ListArray.from_arrays(lists[2][0], pa.array(lists[2][1])),
         pa.ListArray.from_arrays(neg_off, pa.array(neg_items, pa.int32())),
         pa.ListArray.from_arrays(neg_off, pa.array(neg_counts, pa.int32()))],
        schema=ROWS_SCHEMA)


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Concatenation of arange(lo[i], hi[i]) for all i, vectorised."""
    lengths = hi - lo
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    starts = np.repeat(lo - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return starts + np.arange(total)


#: a rows shard's row groups: about this many bytes of lists each
ROW_GROUP_BYTES = 64 << 20


def _row_groups(rows: pa.RecordBatch) -> list[pa.RecordBatch]:
    """``rows`` cut into slices of about ``ROW_GROUP_BYTES`` (by their lists' elements)."""
    sizes = sum(pc.list_value_length(rows.column(c)).to_numpy(zero_copy_only=False).astype(np.int64)
                for c in (S.TRAIN_ITEMS, S.TRAIN_RSTAR, S.VALID_ITEMS, S.TEST_ITEMS, S.NEG_ITEMS,
                          S.NEG_COUNTS)) * 4 + 32
    group = np.cumsum(sizes) // ROW_GROUP_BYTES
    cuts = [0, *(np.flatnonzero(np.diff(group)) + 1).tolist(), rows.num_rows]
    return [rows.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def _write_fn(out_dir: str, split_dir: str, work: Work, rstar_item: np.ndarray, pop: np.ndarray,
              negatives: int, seed: int):
    """``mapInArrow`` function over ``Work.tasks``: a partition's lists and kept split
    (``kept_split``) in; its rows shard (``prepared.schema``, in ``positives_of``'s order) and
    its part of the split table written by pyarrow from the worker; one ``shard, users, bytes,
    crc32`` row out.

    Written from the worker because handing ~1e9 list elements (the negatives at the Yahoo scale)
    to the JVM only to write them costs more than the whole rest of the step. A retried task
    rewrites the same deterministic file names; the directory is published whole. Each shard's
    CRC-32 is computed as its bytes are written, for the manifest.
    """
    table = protocol.alias_table(pop) if negatives else None

    def write(part: int) -> dict:
        import pyarrow.parquet as pq

        fs, root = filesystem(out_dir)
        path = f"{root}/part-{part:05d}.parquet"
        groups, lists = [], work.read("lists", part)
        if lists is not None:
            p = kept_positives(lists, work.read("split", part))
            owner = pa.array(np.repeat(np.arange(len(p["lengths"])), p["lengths"]))
            user_id = pc.cast(p["user_id"], pa.string()).take(owner)
            flat = pa.RecordBatch.from_arrays(
                [pa.array(p["user_index"], pa.int32()).take(owner), user_id,
                 pa.array(p["cold"], pa.bool_()).take(owner), pa.array(p["item_index"], pa.int32()),
                 pa.array(p["code"], pa.int8())],
                names=["user_index", "user_id", "cold", "item_index", "split_code"])
            groups = _row_groups(build_rows(flat, rstar_item, pop, negatives, seed, table))
            split = pa.table({S.USER_ID: user_id, S.ITEM_ID: pc.cast(p["item"], pa.string()),
                              S.SPLIT: pa.array(S.SPLITS).take(pa.array(p["code"])),
                              S.TIMESTAMP: p["ts"]})
            sfs, sroot = filesystem(split_dir)
            pq.write_table(split, f"{sroot}/part-{part:05d}.parquet", filesystem=sfs,
                           compression="zstd")
        sink = Crc32Sink(fs.open_output_stream(path))
        try:  # the writer leaves a file object it was given open
            # no dictionaries: item lists rarely repeat, and trying costs a third of the write
            with pq.ParquetWriter(sink, ROWS_SCHEMA, compression="zstd", use_dictionary=False) as w:
                for g in groups:
                    w.write_batch(g)
        finally:
            sink.close()
        return {"shard": path.rsplit("/", 1)[1], "users": sum(g.num_rows for g in groups),
                "bytes": fs.get_file_info(path).size, "crc32": crc32_hex(sink.crc)}

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            done = [write(part) for part in b.column("part").to_pylist()]
            if done:
                yield pa.RecordBatch.from_pylist(done, schema=pa.schema([
                    ("shard", pa.string()), ("users", pa.int64()), ("bytes", pa.int64()),
                    ("crc32", pa.string())]))

    return fn


def write_user_rows(spark: SparkSession, work: Work, out_dir: str, split_dir: str,
                    rstar_item: np.ndarray, pop: np.ndarray, cfg: ETLConfig) -> list[dict]:
    """Write one Parquet shard of user rows per partition (see ``prepared.schema``) and the split
    table beside them, in one pass over the partitions' lists (``Work``). Returns one
    ``{shard, users, bytes, crc32}`` per shard."""
    for d in (out_dir, split_dir):
        fs, root = filesystem(d)
        fs.create_dir(root, recursive=True)
    fn = _write_fn(out_dir, split_dir, work, rstar_item, pop, cfg.negatives, cfg.seed)
    shards = work.tasks(spark).mapInArrow(
        fn, "shard string, users long, bytes long, crc32 string").collect()
    return sorted((r.asDict() for r in shards), key=lambda r: r["shard"])


def write_items(item_table: pd.DataFrame, out_dir: str) -> None:
    """Write the items table (``prepared.schema``, one row per item, by item index) as one
    Parquet file, from the driver that holds it: a Spark job would ship the whole table inside
    its one task (Spark warns of the task's size) only to write it back from there."""
    import pyarrow.parquet as pq

    fs, root = filesystem(out_dir)
    fs.create_dir(root, recursive=True)
    schema = pa.schema([(S.ITEM_INDEX, pa.int32()), (S.ITEM_ID, pa.string()),
                        (S.POP_TRAIN, pa.int64()), (S.POP_TRAIN_VALID, pa.int64())])
    pq.write_table(pa.Table.from_pandas(item_table, schema=schema, preserve_index=False),
                   f"{root}/part-00000.parquet", filesystem=fs, compression="snappy")


def write_users(users: DataFrame | pa.Table, out_dir: str, partitions: int, n_users: int) -> int:
    """Write the users table (``prepared.schema``): ``users_files`` Parquet files, a range of
    user indices each, sorted within, and file k's range before file k+1's (named part-00000,
    part-00001, ... in that order), so a reader of the directory in file-name order (pyarrow,
    pandas) still gets the rows sorted by user index, as from the single file this table was
    before. ``users``: ``etl.pipeline.index_users``' result, a table the driver writes, or a
    DataFrame written in that many tasks, not one. Returns the file count."""
    files = users_files(n_users, partitions)
    if isinstance(users, pa.Table):
        import pyarrow.parquet as pq

        table = users.select([S.USER_INDEX, S.USER_ID, S.COLD]).cast(USERS_SCHEMA)
        table = table.take(pc.sort_indices(table.column(S.USER_INDEX)))
        fs, root = filesystem(out_dir)
        fs.create_dir(root, recursive=True)
        per_file = math.ceil(n_users / files)
        for k in range(files):
            pq.write_table(table.slice(k * per_file, per_file), f"{root}/part-{k:05d}.parquet",
                           filesystem=fs, compression="snappy")
        return files
    (users.select(S.USER_INDEX, as_str(S.USER_ID), S.COLD)
     .repartitionByRange(files, S.USER_INDEX).sortWithinPartitions(S.USER_INDEX)
     .write.parquet(out_dir))
    return files


USERS_SCHEMA = pa.schema([(S.USER_INDEX, pa.int32()), (S.USER_ID, pa.string()), (S.COLD, pa.bool_())])


#: users per file of the users table: 1.88M users (Yahoo) write 8 files of about 4 MiB
USERS_PER_FILE = 1 << 18


def users_files(n_users: int, partitions: int) -> int:
    """Files (and write tasks) of the users table: about ``USERS_PER_FILE`` users each, at least
    one, at most one per shuffle partition. (An explicit count: ``repartitionByRange(n)`` keeps
    exactly n partitions, where a bare ``orderBy`` would write one small file per shuffle
    partition, 98 at the Yahoo scale.)"""
    return max(1, min(partitions, math.ceil(n_users / USERS_PER_FILE)))
