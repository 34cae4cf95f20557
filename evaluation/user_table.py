"""Everything evaluation needs per user, in one numpy pass per partition of users.

The dataset's user rows (user_id, cold, valid_items, test_items: item indices, one row per user)
and every recommendation file's lists (``encode_batch``'s item indices with their first stray id
and first repeat) are brought together so that a user's rows all land in the same partition:

- ``sharded_user_table``: files that evaluation/score.py wrote hold one file per rows shard,
  named as the shard and holding exactly its users (``co_sharded`` checks the manifest), so a
  task reads a shard and its files with pyarrow (a few shards each). No shuffle; the JVM never
  touches the lists.
- ``user_table``: any other file is hash-partitioned with the rows by user_id (one shuffle).

Each partition is then read whole into numpy and gives one wide row per user:

    user_id, cold, known (a user of the dataset), truth (evaluated: a non-empty truth set),
    and per file i (columns ``column(i, name)``): rows (the file's rows of this user), stray and
    repeat (the smallest stray id and repeated item over those rows), listed (evaluated and with
    a list) and every metric of ``metrics_for(k)`` (null unless listed); on the partition's
    first row only (null elsewhere), the partition's sums: ``moments`` (per group of GROUPS and
    metric: users, mean, sum of squared deviations, of the listed users; ``summary_rows`` merges
    them) and ``pop`` (times each item index was recommended to its warm listed users).

The truth set is the protocol's (a warm user's target split, a cold-start user's valid and test
splits), from the rows table's item-index lists: the same sets a join and a grouping of the
split table give (how evaluation built them before), without either. The metrics are ``metric_arrays``', the
function the per-batch path (``batch_metrics``) calls, on the same hits and truth sizes: the same
values to the last bit. The input checks, the paired differences, the cold-start comparison and
the popularity analysis all read this table (cached), so nothing is joined or grouped by user
again, and nothing that grows with the users reaches the driver.
"""

from __future__ import annotations

import numpy as np

from evaluation.paired import PAIRED
from evaluation.spark_metrics import _flat, metric_arrays, metric_key, metrics_for
from prepared import schema as S
from prepared.protocol import KS, TOP_K
from runtime.spark import few_tasks, shard_tasks

GROUPS = ("warm", "cold")
# the metrics read per user once the table is built (the paired tests'; NDCG also for the
# cold-start plot): the only ones ``sharded_user_table`` hands to the JVM
WIDE_METRICS = tuple(dict.fromkeys(("NDCG",) + PAIRED))
USERS_PER_PARTITION = 100_000  # a partition is held whole in a Python worker: ~0.3 GB per file


def column(i: int, name: str) -> str:
    """The wide table's column ``name`` (a metric key, or rows, stray, repeat, listed, pop) of
    file ``i``."""
    return f"f{i}__{name}"


def _member(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """Whether each of ``keys`` is in ``sorted_keys`` (ascending, distinct): a binary search,
    without the sort of both that ``np.isin`` does (and faster here than Arrow's hash lookup)."""
    if not len(sorted_keys):
        return np.zeros(len(keys), bool)
    at = np.searchsorted(sorted_keys, keys).clip(0, len(sorted_keys) - 1)
    return sorted_keys[at] == keys


def _distinct_sorted(keys: np.ndarray) -> np.ndarray:
    """``np.unique(keys)``: a sort and a comparison of neighbours, where numpy 2's ``unique``
    hashes (10x slower on a partition's keys)."""
    keys = np.sort(keys)
    return keys[np.concatenate(([True], keys[1:] != keys[:-1]))] if len(keys) else keys


def partition_rows(table, ks: list[int], target: str, inverse_log: np.ndarray, n_items: int):
    """One partition (a pyarrow Table: user_id, _src (0: a user row, i + 1: a row of file i),
    cold, _a (valid items / the list), _b (test items), _stray, _repeat) -> the wide rows of its
    users (module docstring), as a dict of Arrow arrays. One function although long: one numpy
    pass over the partition, whose user codes, offsets and sorted lists every metric reuses."""
    import pyarrow as pa
    import pyarrow.compute as pc

    uid = table.column("user_id").combine_chunks()
    codes_arr = pc.dictionary_encode(uid, null_encoding="encode")
    users = codes_arr.dictionary
    codes = codes_arr.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    n_users = len(users)
    src = table.column("_src").to_numpy().astype(np.int64)

    def part(s):  # the rows of one source, with their user codes
        mask = src == s
        return table.filter(pa.array(mask)), codes[mask]

    rows, owner_u = part(0)
    known = np.zeros(n_users, bool)
    known[owner_u] = True
    cold = np.zeros(n_users, bool)
    cold[owner_u] = rows.column(S.COLD).to_numpy().astype(bool)
    # truth: (user, item) keys, distinct; a warm user's target split, a cold user's both
    width = n_items + 1
    keys = []
    for name, split in (("_a", "valid"), ("_b", "test")):
        values, _, owner = _flat(rows.column(name))
        user = owner_u[owner]
        item = values.to_numpy(zero_copy_only=False).astype(np.int64)
        take = (cold[user] | (split == target)) & (item >= 0)
        keys.append(user[take] * width + item[take])
    truth_keys = _distinct_sorted(np.concatenate(keys))
    n = np.bincount(truth_keys // width, minlength=n_users)
    evaluated = np.flatnonzero(known & (n > 0))
    slot = np.full(n_users, -1, np.int64)
    slot[evaluated] = np.arange(len(evaluated))
    n_eval = n[evaluated].astype(np.float64)

    out = {"user_id": users, "cold": pa.array(cold, mask=~known), "known": pa.array(known),
           "truth": pa.array(slot >= 0)}
    for i, k in enumerate(ks):
        recs, owner_r = part(i + 1)
        count = np.bincount(owner_r, minlength=n_users)
        out[column(i, "rows")] = pa.array(count.astype(np.int32))
        for name in ("stray", "repeat"):  # the smallest over a user's rows (more than one: refused)
            worst = [None] * n_users
            col = recs.column(f"_{name}")
            for j in np.flatnonzero(col.is_valid().to_numpy(zero_copy_only=False)):
                u, v = owner_r[j], col[int(j)].as_py()
                worst[u] = v if worst[u] is None else min(worst[u], v)
            out[column(i, name)] = pa.array(worst, pa.string())
        # a user's list: their first row (a user on two rows is refused by the checks)
        first = np.full(n_users, -1, np.int64)
        seen, at = np.unique(owner_r, return_index=True)
        first[seen] = at
        values, lengths, owner = _flat(recs.column("_a"))
        item = values.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        starts = np.zeros(len(lengths), np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        position = np.arange(len(item)) - starts[owner]
        user = owner_r[owner]
        chosen = (first[user] == owner) & (slot[user] >= 0)
        listed_users = np.zeros(n_users, bool)
        listed_users[seen] = True
        listed = listed_users[evaluated]
        length = max(K for K in KS if K <= k)
        inside = chosen & (position < length)
        hit = (item >= 0) & _member(user * width + item, truth_keys)
        hits = np.zeros((len(evaluated), length))
        hits[slot[user[inside]], position[inside]] = hit[inside]
        metrics = metric_arrays(hits, n_eval, k, inverse_log)
        is_listed = np.zeros(n_users, bool)
        is_listed[evaluated] = listed
        out[column(i, "listed")] = pa.array(is_listed)
        for m, v in metrics.items():
            full = np.zeros(n_users)
            full[evaluated] = v
            out[column(i, metric_key(m))] = pa.array(full, pa.float64(), mask=~is_listed)
        # the moments of each metric per group (warm, cold) of the listed users: merged over
        # the partitions on the driver (``summary_rows``) instead of an aggregation over users
        moments = np.zeros((len(GROUPS), len(metrics), 3))
        for g, is_cold in enumerate((False, True)):
            mine = listed & (cold[evaluated] == is_cold)
            for j, v in enumerate(metrics.values()):
                x = v[mine]
                if len(x):
                    mean = x.sum() / len(x)
                    moments[g, j] = (len(x), mean, ((x - mean) ** 2).sum())
        out[column(i, "moments")] = pa.array([moments.ravel().tolist()] + [None] * (n_users - 1),
                                             pa.list_(pa.float64()))
        # popularity: every listed warm user's whole list (its top TOP_K)
        counted = chosen & is_listed[user] & ~cold[user] & (item >= 0)
        pop = np.bincount(item[counted], minlength=n_items).astype(np.int64)
        out[column(i, "pop")] = pa.array([pop.tolist()] + [None] * (n_users - 1),
                                         pa.list_(pa.int64())) if n_users else \
            pa.array([], pa.list_(pa.int64()))
    return out


def keep_truth_of(rows, users: str, ids: frozenset[str] | None):
    """``rows`` (a pyarrow Table of user_id, cold, valid and test items) with the truth sets of
    the users outside ``--users`` (``warm``, ``cold`` or ``ids``; ``all`` keeps every one)
    emptied: they stay users of the dataset, so their lists are not strays, but are not
    evaluated (no truth set), nor counted in the popularity of the lists."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if users == "all":
        return rows
    keep = (pc.equal(rows.column(S.COLD), users == "cold") if users in ("warm", "cold") else
            pc.is_in(rows.column(S.USER_ID).cast(pa.string()),
                     value_set=pa.array(sorted(ids or ()), pa.string())))
    for name in (S.VALID_ITEMS, S.TEST_ITEMS):
        column = rows.column(name)
        rows = rows.set_column(rows.schema.get_field_index(name), name,
                               pc.if_else(keep, column, pa.scalar([], column.type)))
    return rows


def wide_schema(ks: list[int], metrics: tuple[str, ...] | None = None):
    """The Spark schema of ``partition_rows``' output; with ``metrics`` (names as ``METRICS``),
    only those of each file's metric columns (the rest stay in the tasks: ``sharded_user_table``)."""
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        DoubleType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    fields = [StructField("user_id", StringType()), StructField("cold", BooleanType()),
              StructField("known", BooleanType()), StructField("truth", BooleanType())]
    for i, k in enumerate(ks):
        fields += [StructField(column(i, "rows"), IntegerType()),
                   StructField(column(i, "stray"), StringType()),
                   StructField(column(i, "repeat"), StringType()),
                   StructField(column(i, "listed"), BooleanType())]
        fields += [StructField(column(i, metric_key(m)), DoubleType()) for m in metrics_for(k)
                   if metrics is None or m in metrics]
        fields += [StructField(column(i, "moments"), ArrayType(DoubleType())),
                   StructField(column(i, "pop"), ArrayType(LongType()))]
    return StructType(fields)


def user_table(spark, prep, encoded: list, ks: list[int], target: str,
               inverse_log: np.ndarray, n_items: int, partitions: int, users: str = "all",
               ids: frozenset[str] | None = None):
    """The wide per-user table (module docstring) of ``prep``'s users and the ``encoded`` lists
    (one DataFrame per file, ``encode_lists``' output; ``ks`` their list lengths), over
    ``partitions`` hash partitions of user_id; only ``users`` evaluated (``keep_truth_of``).
    Lazy: the caller caches it."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    rows = spark.read.parquet(f"{prep.uri}/{prep.manifest['layout']['rows']}")
    none_s, none_a = F.lit(None).cast("string"), F.lit(None).cast("array<int>")
    truth_a = F.col(S.VALID_ITEMS).cast("array<int>")
    truth_b = F.col(S.TEST_ITEMS).cast("array<int>")
    if users != "all":  # keep_truth_of's rule, in Spark
        keep = (F.col(S.COLD) == (users == "cold") if users in ("warm", "cold") else
                F.col(S.USER_ID).cast("string").isin(sorted(ids or ())))
        empty = F.array().cast("array<int>")
        truth_a, truth_b = (F.when(keep, c).otherwise(empty) for c in (truth_a, truth_b))
    parts = [rows.select(F.col(S.USER_ID).cast("string").alias("user_id"),
                         F.lit(0).alias("_src"), F.col(S.COLD).alias("cold"),
                         truth_a.alias("_a"), truth_b.alias("_b"),
                         none_s.alias("_stray"), none_s.alias("_repeat"))]
    for i, df in enumerate(encoded):
        parts.append(df.select("user_id", F.lit(i + 1).alias("_src"),
                               F.lit(None).cast("boolean").alias("cold"), F.col("_items").alias("_a"),
                               none_a.alias("_b"), "_stray", "_repeat"))
    both = parts[0]
    for p in parts[1:]:
        both = both.unionByName(p)
    schema = wide_schema(ks)
    names = schema.fieldNames()

    def run(batches):
        batches = list(batches)
        if not batches or not sum(b.num_rows for b in batches):
            return
        table = pa.Table.from_batches(batches)
        cols = partition_rows(table, ks, target, inverse_log, n_items)
        yield pa.RecordBatch.from_arrays([cols[c] for c in names], names=names)

    return both.repartition(partitions, "user_id").mapInArrow(run, schema)


def co_sharded(manifest: dict, prep) -> bool:
    """Whether a recommendation file (its scoring ``manifest``) holds one file per rows shard of
    ``prep``, named as the shard and scored from exactly those rows (the same names and CRC-32s:
    the same data wherever it is mounted), so that ``sharded_user_table`` may pair them:
    evaluation/score.py writes files so."""
    rows = prep.row_shards()
    return bool(rows) and None not in rows.values() and manifest.get("row_shards") == rows \
        and set(rows) <= set(manifest.get("files", {}))


def shard_table(rows, lists: list):
    """``partition_rows``' input from one rows shard (a pyarrow Table of user_id, cold, valid and
    test items) and each file's encoded lists of the same users (``encode_batch``'s output)."""
    import pyarrow as pa

    ints = pa.list_(pa.int32())
    n = rows.num_rows
    parts = [pa.table({"user_id": rows.column(S.USER_ID).cast(pa.string()),
                       "_src": pa.array(np.zeros(n, np.int32)), "cold": rows.column(S.COLD),
                       "_a": rows.column(S.VALID_ITEMS).cast(ints),
                       "_b": rows.column(S.TEST_ITEMS).cast(ints),
                       "_stray": pa.nulls(n, pa.string()), "_repeat": pa.nulls(n, pa.string())})]
    for i, e in enumerate(lists):
        m = e.num_rows
        parts.append(pa.table({"user_id": e.column("user_id"),
                               "_src": pa.array(np.full(m, i + 1, np.int32)),
                               "cold": pa.nulls(m, pa.bool_()), "_a": e.column("_items"),
                               "_b": pa.nulls(m, ints), "_stray": e.column("_stray"),
                               "_repeat": e.column("_repeat")}))
    return pa.concat_tables(parts)


def long_metric_names(ks: list[int]) -> list[str]:
    """The per-user table's metric columns for files of lists of ``ks``: the first file's, then
    any a later file adds (a file of shorter lists has fewer: null in its rows)."""
    names: list[str] = []
    for k in ks:
        names += [metric_key(m) for m in metrics_for(k) if metric_key(m) not in names]
    return names


def long_rows(cols: dict, labels: list[str], ks: list[int]):
    """``partition_rows``' wide columns -> the per-user table's rows (a pyarrow Table): for each
    file in order, its listed users as (label, group, user_id, every metric of
    ``long_metric_names``), the rows ``evaluate.py`` publishes as ``per_user/``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = long_metric_names(ks)
    group = pc.if_else(pc.fill_null(cols["cold"], False), "cold", "warm")  # every file's
    parts = []
    for i, (label, k) in enumerate(zip(labels, ks)):
        listed = cols[column(i, "listed")]
        n = pc.sum(listed).as_py() or 0
        mine = set(metric_key(m) for m in metrics_for(k))
        parts.append(pa.table(
            {"label": pa.array([label] * n, pa.string()), "group": group.filter(listed),
             "user_id": cols["user_id"].filter(listed),
             **{m: (cols[column(i, m)].filter(listed) if m in mine else pa.nulls(n, pa.float64()))
                for m in names}}))
    return pa.concat_tables(parts)


def sharded_user_table(spark, prep, paths: list[str], ks: list[int], target: str,
                       inverse_log: np.ndarray, catalogue: list[str],
                       per_user: tuple[str, list[str]] | None = None, users: str = "all",
                       ids: frozenset[str] | None = None):
    """``user_table`` without its shuffle, for files that ``co_sharded`` accepts: for each rows
    shard, a task (of ``runtime.spark.few_tasks``, each taking consecutive shards) reads the
    shard and each file's file of the same name with pyarrow (a user's row and lists are in
    them, and nowhere else), encodes the lists and runs ``partition_rows`` on the shard: the
    partition sums (``moments``, ``pop``) are per shard. The JVM never reads the lists nor moves
    them between tasks; it gets the metrics of ``WIDE_METRICS`` only where the tasks write the
    per-user rows themselves (``per_user``). Lazy: the caller caches it.

    ``per_user`` (a directory, the files' labels): each task also writes its users' per-user rows
    (``long_rows``) there, as one Parquet file named as the shard, from the arrays it already
    holds: Spark would otherwise read them back from the cache and write them in a job of their
    own. The directory must be a staging one its caller deletes on failure; a task run again
    (a retry, a recomputed cache block) rewrites the same file with the same rows."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from evaluation.spark_metrics import encode_batch
    from prepared.uri import filesystem, join

    shards = list(prep.row_shards())
    rows_uri, n_items, item_ids = prep.rows_uri, len(catalogue), list(catalogue)
    # With the per-user rows written here, the JVM gets only what evaluate.py reads per user
    # after this pass (the checks' columns, the paired tests' and the cold-start plot's metrics,
    # the partitions' sums): converting and caching every metric of 1.9M users took longer
    # than computing them (benchmarks/results/evaluate_speed.md).
    schema = wide_schema(ks, WIDE_METRICS if per_user else None)
    names = schema.fieldNames()

    def run(batches):
        items = pa.array(item_ids, pa.string())
        fs, root = filesystem(rows_uri)
        sources = [filesystem(p) for p in paths]
        out_fs, out_root = filesystem(per_user[0]) if per_user else (None, None)
        if per_user:
            out_fs.create_dir(out_root, recursive=True)
        for b in batches:
            for shard in b.column("shard").to_pylist():
                rows = keep_truth_of(pq.read_table(
                    join(root, shard), filesystem=fs,
                    columns=[S.USER_ID, S.COLD, S.VALID_ITEMS, S.TEST_ITEMS]), users, ids)
                lists = []
                for f_fs, f_root in sources:
                    # the ids as a dictionary (Parquet's own): each distinct id looked up once
                    t = pq.read_table(join(f_root, shard), filesystem=f_fs,
                                      columns=["user_id", "item_ids"],
                                      read_dictionary=["item_ids.list.element"])
                    batch = pa.RecordBatch.from_arrays(  # the protocol's top list, as read_recs
                        [t.column("user_id").combine_chunks().cast(pa.string()),
                         pc.list_slice(t.column("item_ids").combine_chunks(), 0, TOP_K)],
                        names=["user_id", "item_ids"])
                    lists.append(encode_batch(batch, items))
                table = shard_table(rows, lists)
                if not table.num_rows:
                    continue
                cols = partition_rows(table, ks, target, inverse_log, n_items)
                if per_user:
                    pq.write_table(long_rows(cols, per_user[1], ks), join(out_root, shard),
                                   filesystem=out_fs)
                yield pa.RecordBatch.from_arrays([cols[c] for c in names], names=names)

    # a few shards per task: a Python task's start-up (~60 ms) is a third of a shard's work here
    return shard_tasks(spark, shards, few_tasks(spark)).mapInArrow(run, schema)


def summary_rows(parts: list, labels: list[str], ks: list[int]) -> list[dict]:
    """The summary rows (label, group, metric, mean, ci95 = 1.96 std_pop / sqrt(n), users)
    from the partitions' ``moments`` (``parts``: one list per partition, each with one moments
    array per file, None for a partition without users), merged pairwise (Chan et al.: exact
    in exact arithmetic; in floating point within a few ulps of Spark's avg and stddev_pop, as
    tests/spark_reference.py's ``summarise`` computes them)."""
    out = []
    for i, (label, k) in enumerate(zip(labels, ks)):
        names = metrics_for(k)
        total = np.zeros((len(GROUPS), len(names), 3))
        for part in parts:
            if part[i] is None:
                continue
            m = np.asarray(part[i], np.float64).reshape(total.shape)
            n_a, n_b = total[..., 0], m[..., 0]
            n = n_a + n_b
            delta = m[..., 1] - total[..., 1]
            safe = np.where(n > 0, n, 1.0)
            total = np.stack([n, total[..., 1] + delta * n_b / safe,
                              total[..., 2] + m[..., 2] + delta ** 2 * n_a * n_b / safe], axis=-1)
        for g, group in enumerate(GROUPS):
            for j, name in enumerate(names):
                n, mean, m2 = total[g, j]
                if n == 0:  # no listed user in this group
                    continue
                out.append({"label": label, "group": group, "metric": name, "mean": float(mean),
                            "ci95": float(1.96 * np.sqrt(m2 / n) / n ** 0.5), "users": int(n)})
    return out
