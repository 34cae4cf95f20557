"""The ETL's one shuffle, rating rows to their user's partition, through Arrow files in the work
directory (``etl.pipeline.Work``) instead of Spark's shuffle.

The rows start as Arrow (from the JVM's parser, or born in Python for synthetic data) and end as
Arrow in ``etl.passes.dedup``. Spark's shuffle turned each row into an UnsafeRow, hashed, wrote,
read and turned it back into Arrow between the two. Measured at a quarter of the Yahoo shape on
2 cores (12.2M rows, 2026-12-07): 14.0 s through Spark's shuffle, 10.8 s through these files,
6.5 s for synthetic rows generated and partitioned in the one Python task, with no JVM between.

- A map task writes one Arrow IPC file, ``shuffle/map-NNNNN.arrow``: record batch ``k`` holds
  its rows of partition ``k`` (empty where it has none), in the order it read them. The file is
  written under a temporary name and renamed, so a retried task replaces it whole.
- A reduce task reads batch ``k`` of every map file the map job reported.
- A user's partition is Spark's own hash partitioning, ``pmod(hash(user_id), n)`` (Murmur3,
  seed 42): the shards hold the users they held under ``repartition(n, "user_id")``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from prepared.uri import filesystem

#: the column that carries a row's partition from the JVM to the map task (dropped there)
PART = "_part"
#: a map task's one output row: the id of the file it wrote
MAP_SCHEMA = "map int"


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    k = _rotl(k * np.uint32(0xCC9E2D51), 15) * np.uint32(0x1B873593)
    return _rotl(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def spark_hash_long(ids: np.ndarray) -> np.ndarray:
    """Spark's ``hash()`` of a bigint column (Murmur3_x86_32 ``hashLong``, seed 42), int32."""
    v = np.asarray(ids, np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        h = np.full(len(v), 42, np.uint32)
        h = _mix(h, (v & np.uint64(0xFFFFFFFF)).astype(np.uint32))
        h = _mix(h, (v >> np.uint64(32)).astype(np.uint32))
        h ^= np.uint32(8)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h.view(np.int32)


def partition_of(ids: np.ndarray, partitions: int) -> np.ndarray:
    """``pmod(hash(user_id), partitions)`` for bigint ids, as Spark's hash partitioning."""
    return np.mod(spark_hash_long(ids).astype(np.int64), partitions)


def map_path(root: str, map_id: int) -> str:
    return f"{filesystem(root)[1]}/shuffle/map-{map_id:05d}.arrow"


def write_map(root: str, partitions: int, map_id: int, attempt: int, table: pa.Table,
              part: np.ndarray) -> None:
    """Map task ``map_id``'s rows (``table``, ``part`` the partition of each) as one file of
    ``partitions`` record batches, published by a rename."""
    order = np.argsort(part, kind="stable")  # keeps the rows' order within a partition
    bounds = np.searchsorted(part[order], np.arange(partitions + 1))
    batch = table.take(pa.array(order)).combine_chunks()
    batch = (batch.to_batches()[0] if batch.num_rows else
             pa.RecordBatch.from_pylist([], schema=table.schema))
    fs, _ = filesystem(root)
    path = map_path(root, map_id)
    tmp = f"{path}.{attempt}.tmp"
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(tmp) as f, pa.ipc.new_file(
            f, batch.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as w:
        for k in range(partitions):
            w.write_batch(batch.slice(bounds[k], bounds[k + 1] - bounds[k]))
    fs.move(tmp, path)


def read_partition(root: str, maps: list[int], part: int) -> pa.Table | None:
    """Partition ``part``'s rows from the map files of ``maps``; None when it has none."""
    fs, _ = filesystem(root)
    batches = []
    for m in maps:
        with fs.open_input_file(map_path(root, m)) as f:
            b = pa.ipc.open_file(f).get_batch(part)
            if b.num_rows:
                batches.append(b)
    return pa.Table.from_batches(batches).combine_chunks() if batches else None


def task_map(root: str, partitions: int, table: pa.Table, part: np.ndarray) -> pa.RecordBatch:
    """``write_map`` from inside a Spark task, as map (the task's partition id) and attempt; the
    row (``MAP_SCHEMA``) that reports the file to ``map_ids``."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    write_map(root, partitions, ctx.partitionId(), ctx.attemptNumber(), table, part)
    return pa.RecordBatch.from_pydict({"map": pa.array([ctx.partitionId()], pa.int32())})


def map_ids(maps: DataFrame) -> list[int]:
    """Run a map job (a ``mapInArrow`` whose tasks return ``task_map``'s rows); the ids of the
    files it wrote, which the reduce side reads."""
    return sorted(r["map"] for r in maps.collect())


def _map_fn(root: str, partitions: int):
    """``mapInArrow`` function of ``by_user``: a task's rows (with ``PART``) to its map file."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = [b for b in batches if b.num_rows]
        if batches:
            table = pa.Table.from_batches(batches)
            yield task_map(root, partitions, table.drop_columns([PART]),
                           table.column(PART).to_numpy())

    return fn


def by_user(rows: DataFrame, root: str, partitions: int) -> list[int]:
    """Write ``rows``' map files (one per Spark partition of ``rows`` with any row); returns the
    map ids the reduce side reads."""
    tagged = rows.withColumn(PART, F.pmod(F.hash("user_id"), F.lit(partitions)).cast("int"))
    return map_ids(tagged.mapInArrow(_map_fn(root, partitions), MAP_SCHEMA))
