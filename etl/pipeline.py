"""The ETL's Spark steps, from parsed lines to a prepared directory (see ``prepared.schema``).

Each step ends in an action, so the progress log's time per step is the time of that step.
One shuffle by user id brings each user's ratings into one partition; from there the per-user
work is numpy on a partition at a time (``etl.passes``), in two passes over the user lists kept
per partition (``user_lists``, ``Work``): one to split and count (popularity), one to write the
rows and the split table from the split the first kept (``etl.write``).
Only the small global steps are Spark sorts and aggregates: user and item indices (positions in
a sort, ``positions``), the cold-user draw, the counts.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from etl import passes, shuffle
from etl.config import ETLConfig, PositiveRule
from etl.sources import mark_bad, parse
from etl.synthetic import synthetic_maps, synthetic_rows
from prepared import protocol
from prepared import schema as S
from prepared.errors import InputDataError
from prepared.uri import filesystem
from runtime.spark import few_tasks, one_task_each

log = logging.getLogger("etl")

SKIPPED_KINDS = ("blank", "comment", "header", "movie")
MAX_EXAMPLES = 5


@dataclass
class Progress:
    """A log line per step with its counts and time; the timings also go into the manifest."""

    steps: list = field(default_factory=list)
    _t: float = field(default_factory=time.perf_counter)

    def done(self, name: str, **counts) -> None:
        now = time.perf_counter()
        took = now - self._t
        self._t = now
        self.steps.append({"step": name, "seconds": round(took, 3), **counts})
        shown = ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in counts.items())
        log.info("%-12s %7.1fs  %s", name, took, shown)


def _yahoo_checks(parsed: DataFrame) -> DataFrame:
    """Yahoo R1 ratings are integers 0-100, or 255 ("never play again"); anything else is bad."""
    r = F.col("rating")
    invalid = (F.col("kind") == "row") & ~(((r >= 0) & (r <= 100) & (r == F.floor(r))) | (r == 255))
    return mark_bad(parsed, F.when(invalid, F.format_string(
        "rating %s in column 3 is not an integer in 0-100 or 255", F.col("rating").cast("string"))))


# Ids in this canonical integer form survive string -> long -> string unchanged, so the pipeline
# carries them as longs (cheaper to shuffle, hash, sort and cache than strings) and writes them
# back as strings. Anything else ("007", "u42") stays a string throughout.
CANONICAL_INT = r"^(0|-?[1-9][0-9]{0,17})$"


def as_str(column: str) -> Column:
    """An id column as the string it was read as (a no-op for string columns)."""
    return F.col(column).cast("string").alias(column)


def _all_integers(df: DataFrame, column: str) -> bool:
    """Whether every id in ``column`` is a plain integer of at most 18 digits (then ids order as
    numbers, as a long)."""
    if dict(df.dtypes)[column] == "bigint":
        return True
    return bool(df.agg(F.coalesce(F.bool_and(F.col(column).rlike(r"^-?[0-9]{1,18}$")), F.lit(True)))
                .first()[0])


def _order_key(column: str, numeric: bool) -> list[Column]:
    """Id order: as numbers when all ids are integers, ties ('7' and '007') by their text."""
    return [F.col(column).cast("long"), F.col(column)] if numeric else [F.col(column)]


def read_validated(spark: SparkSession, cfg: ETLConfig, files: list[str], progress: Progress,
                   counts: dict, labels: dict[str, str] | None = None) -> DataFrame:
    """Parsed rating rows ``user_id, item_id, rating, timestamp, gpos, given``; bad rows counted.
    ``labels``: each file's given split (``--split given`` with a file per split)."""
    if cfg.spec.layout.generated:
        rows = synthetic_rows(spark, cfg.users, cfg.items, cfg.positives, cfg.seed,  # long ids
                              topics=cfg.topics, affinity=cfg.affinity, zipf=cfg.zipf)
        # generated pairs are distinct: no position is needed to break ties
        return rows.select("*", F.lit(0).cast("long").alias("gpos"),
                           F.lit(None).cast("byte").alias("given"))
    parsed = parse(spark, cfg, files, labels)
    if cfg.spec.layout.rating_255:
        parsed = _yahoo_checks(parsed)
    is_row = F.col("kind") == "row"
    stats = parsed.groupBy("kind").agg(
        F.count(F.lit(1)).alias("n"),
        F.bool_and(F.when(is_row, F.col("user_id").rlike(CANONICAL_INT))).alias("users_int"),
        F.bool_and(F.when(is_row, F.col("item_id").rlike(CANONICAL_INT))).alias("items_int"),
    ).collect()
    by_kind = {r["kind"]: r["n"] for r in stats}
    row_stats = next((r for r in stats if r["kind"] == "row"), None)
    n_rows, n_bad = by_kind.get("row", 0), by_kind.get("bad", 0)
    counts["lines"] = {k: int(by_kind.get(k, 0)) for k in ("row", "bad", *SKIPPED_KINDS)}
    examples = []
    if n_bad:
        examples = [f"{r['file']}:{r['line']}: {r['error']}: {(r['text'] or '').strip()[:100]!r}"
                    for r in parsed.where(F.col("kind") == "bad").orderBy("file", "line")
                    .select("file", "line", "error", "text").limit(MAX_EXAMPLES).collect()]
        by_error = parsed.where(F.col("kind") == "bad").groupBy(
            F.regexp_replace("error", "'[^']*'|[0-9]+", "_").alias("e")).count().collect()
        counts["bad_rows_by_reason"] = {r["e"]: int(r["count"]) for r in by_error}
    counts["bad_row_examples"] = examples
    if n_rows + n_bad == 0:
        raise InputDataError(f"{', '.join(files)[:300]}: no data lines found (only blank, comment "
                             f"or header lines); check --input and --dataset")
    share = n_bad / (n_rows + n_bad)
    if n_bad and share > cfg.max_bad_rows:
        raise InputDataError(
            f"{n_bad:,} of {n_rows + n_bad:,} data lines ({share:.2%}) are malformed, more than "
            f"--max-bad-rows {cfg.max_bad_rows:g} allows. First ones:\n  " + "\n  ".join(examples)
            + f"\nFix the input (is --dataset {cfg.dataset} its format?) or raise --max-bad-rows "
              "to skip such lines.")
    for e in examples:
        log.warning("skipped malformed line %s", e)
    progress.done("read", rows=n_rows, bad=n_bad, skipped=sum(by_kind.get(k, 0) for k in SKIPPED_KINDS))
    as_long = {"user_id": row_stats["users_int"], "item_id": row_stats["items_int"]}
    ids = [F.col(c).cast("long").alias(c) if as_long[c] else F.col(c) for c in as_long]
    return parsed.where(is_row).select(*ids, "rating", "timestamp", "gpos", "given")


def _arrow_type(spark_type: str) -> pa.DataType:
    return {"bigint": pa.int64(), "string": pa.string()}[spark_type]


def _ddl(schema: pa.Schema) -> str:
    """A Spark DDL schema for an Arrow schema of the types ``etl.passes`` uses."""
    names = {pa.int8(): "tinyint", pa.int32(): "int", pa.int64(): "bigint", pa.string(): "string",
             pa.bool_(): "boolean", pa.float32(): "float", pa.float64(): "double"}
    spell = lambda t: f"array<{names[t.value_type]}>" if pa.types.is_list(t) else names[t]
    return ", ".join(f"{f.name} {spell(f.type)}" for f in schema)


def _partition_table(batches: Iterator[pa.RecordBatch]) -> pa.Table | None:
    """A task's whole partition as one table (None when it is empty)."""
    batches = [b for b in batches if b.num_rows]
    return pa.Table.from_batches(batches) if batches else None


@dataclass(frozen=True)
class Work:
    """Where the per-user passes keep a partition's data between Spark jobs (under the staging
    directory, removed before publishing): ``shuffle/map-NNNNN.arrow``, the rating rows by
    partition (``etl.shuffle``), ``lists/part-NNNNN.arrow``, each user's positives
    (``etl.passes.lists_schema``), ``users/part-NNNNN.arrow``, its users' indices, and
    ``split/part-NNNNN.arrow``, the split pass's result for the write pass (``kept_split``). Arrow
    files, read by the next pass's task for that partition with no trip through the JVM: the
    lists hold every positive, and turning them into Spark rows and back cost more than the
    passes' own work."""

    root: str
    partitions: int

    def path(self, kind: str, part: int) -> str:
        return f"{filesystem(self.root)[1]}/{kind}/part-{part:05d}.arrow"

    def write(self, kind: str, part: int, table: pa.Table | pa.RecordBatch) -> None:
        fs, _ = filesystem(self.root)
        fs.create_dir(self.path(kind, part).rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(self.path(kind, part)) as f, pa.ipc.new_file(
                f, table.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as w:
            w.write(table)

    def read(self, kind: str, part: int) -> pa.Table | None:
        """The partition's table; None when the partition had no such rows."""
        fs, _ = filesystem(self.root)
        path = self.path(kind, part)
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with fs.open_input_file(path) as f:
            return pa.ipc.open_file(f).read_all()

    def tasks(self, spark: SparkSession) -> DataFrame:
        """The partitions (``part int``), consecutive ones in each of a few Spark tasks per core
        (``few_tasks``): the passes over them take a fraction of a second a partition, and a
        Python task's start-up ~60 ms."""
        return one_task_each(spark, list(range(self.partitions)), "part int", few_tasks(spark))


def user_lists(rows: DataFrame, cfg: ETLConfig, work: Work, progress: Progress,
               counts: dict) -> tuple[DataFrame, dict]:
    """Dedup (the most recent row of a pair decides; ties: the later line), binarise, and gather
    each user's positives: one shuffle by user (``etl.shuffle``, through the work directory),
    then ``etl.passes.dedup`` per partition, which writes the partition's lists (``Work``).
    Synthetic rows go to the shuffle's files from the tasks that generate them, except under
    a random split, whose seeded order the JVM computes (``_split_order``).

    Returns, persisted, the counts (``etl.passes.counts_schema`` and ``part``, the partition):
    one row per user (users whose pairs are all negative have ``n_pos`` 0) and two per partition
    listing its distinct items; and the totals ``split_rule`` needs.
    """
    rule = PositiveRule.parse(cfg.positive_rule)
    hashed = cfg.split_mode in ("random", "given")
    if hashed:
        # the seeded order of a random split, on the ids as read (see _split_order)
        rows = rows.withColumn("rhash", _split_order("random", cfg.seed)[0])
    types = dict(rows.dtypes)
    user_type, item_type = _arrow_type(types["user_id"]), _arrow_type(types["item_id"])
    lists = passes.lists_schema(user_type, item_type, cfg.split_mode == "given", hashed)
    per_user = passes.counts_schema(user_type, item_type)

    spark = rows.sparkSession
    if cfg.spec.layout.generated and not hashed:
        maps = synthetic_maps(spark, work.root, work.partitions, cfg.users, cfg.items,
                              cfg.positives, cfg.seed, topics=cfg.topics, affinity=cfg.affinity,
                              zipf=cfg.zipf)
    else:
        maps = shuffle.by_user(rows, work.root, work.partitions)

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for part in b.column("part").to_pylist():
                table = shuffle.read_partition(work.root, maps, part)
                if table is None:
                    continue
                mine, tally = passes.dedup(table, rule, lists, per_user)
                if mine.num_rows:  # a partition whose users have no positive: no lists, no users
                    work.write("lists", part, mine)
                yield tally.append_column("part", pa.array(np.full(tally.num_rows, part, np.int32)))

    out = (work.tasks(spark).mapInArrow(fn, _ddl(per_user) + ", part int")
           .persist(StorageLevel.MEMORY_AND_DISK))
    is_user = F.col("n_pos") >= 0
    agg = out.where(is_user).agg(
        F.count(F.lit(1)).alias("users_raw"), F.sum("n_pos").alias("positives"),
        *[F.sum(c).alias(c) for c in passes.COUNTS]).first()
    with small_shuffles(out.sparkSession, 0):
        items_raw = (out.where(F.col("n_pos") == passes.ALL_ITEMS).select(F.explode("items"))
                     .distinct().count())
    n_rows, n_pairs, n_pos = (int(agg[k] or 0) for k in ("rows", "pairs", "positives"))
    counts.update(rows=n_rows, duplicate_rows=n_rows - n_pairs, pairs=n_pairs,
                  non_positive_pairs=n_pairs - n_pos, users_raw=int(agg["users_raw"]),
                  items_raw=items_raw)
    if cfg.spec.layout.rating_255:
        counts["rating_255_pairs"] = int(agg["r255"] or 0)
    if cfg.split_mode == "given":
        counts["pairs_in_two_splits"] = int(agg["twice"] or 0)
        if agg["twice"]:
            log.warning("%s (user, item) pairs appear in two given splits; each is kept in the "
                        "earlier one (train before valid before test)", f"{int(agg['twice']):,}")
    if n_pos == 0:
        out.unpersist()
        raise InputDataError(
            f"no positives left after binarising {n_pairs:,} (user, item) pairs with --positive "
            f"'{rule}'; check the rule against the rating scale of --dataset {cfg.dataset}")
    progress.done("dedup", rows=n_rows, duplicates=n_rows - n_pairs, pairs=n_pairs,
                  positives=n_pos)
    return out, {k: int(agg[k] or 0) for k in ("timed", "given_train", "given_valid", "given_test")}


#: rows per shuffle partition of the small steps (indices, counts): a task per partition of the
#: big table's 98 at the Yahoo scale costs more in scheduling than these steps' work
SMALL_STEP_ROWS = 1 << 20


@contextlib.contextmanager
def small_shuffles(spark: SparkSession, rows: int):
    """Shuffles of a step over ``rows`` rows (users, items) in few partitions: as many as the
    cluster has cores, more only past ``SMALL_STEP_ROWS`` each. Restores the setting after."""
    key = "spark.sql.shuffle.partitions"
    before = spark.conf.get(key)
    n = max(spark.sparkContext.defaultParallelism, math.ceil(rows / SMALL_STEP_ROWS))
    spark.conf.set(key, str(n))
    try:
        yield
    finally:
        spark.conf.set(key, before)


def positions(df: DataFrame, order: list, name: str) -> DataFrame:
    """``df`` with an int column ``name``: each row's 0-based position in ``order``, which must be
    a total order; persisted. What ``row_number()`` over a window with no partition gives, without
    sorting every row in one task: a range-partitioned sort (parallel), then each row's place in
    its partition plus the rows of the partitions before it (one count per partition on the
    driver). The sort is cached while the counts and the positions are taken from it: a second
    run of a range partitioning samples again and may cut the ranges elsewhere."""
    ranked = (df.orderBy(*order)
              .withColumn("_part", F.spark_partition_id())
              # within a partition: consecutive from the partition's first row, in sorted order
              .withColumn("_local", F.monotonically_increasing_id())
              .persist(StorageLevel.MEMORY_AND_DISK))
    parts = sorted(ranked.groupBy("_part").agg(F.count(F.lit(1)).alias("n"),
                                               F.min("_local").alias("first")).collect())
    before, shift = 0, []
    for r in parts:  # position = _local - first + rows before the partition
        shift += [F.lit(r["_part"]), F.lit(before - r["first"])]
        before += r["n"]
    at = F.create_map(*shift)[F.col("_part")] if shift else F.lit(0)
    out = (ranked.withColumn(name, (F.col("_local") + at).cast("int")).drop("_part", "_local")
           .persist(StorageLevel.MEMORY_AND_DISK))
    out.count()  # cached before the sort it came from goes: a new sort may cut its ranges elsewhere
    ranked.unpersist()
    return out


#: users up to which ``index_users`` ranks them on the driver: one collect of ~40 bytes a user
#: (plus the id's text) and two numpy sorts (1.88M users, the Yahoo scale: ~2 s) in place of the
#: distributed sorts' ~40 small Spark jobs and the users files' own shuffle (~18 s there). 5M
#: users of 36-character ids (UUIDs) collect ~0.4 GB, within Spark's default 1 GB
#: ``spark.driver.maxResultSize`` and the default 4 GB driver. Beyond it the sorts keep any one
#: process from holding every user.
DRIVER_USERS = 5_000_000


def index_users(lists: DataFrame, cfg: ETLConfig, progress: Progress, counts: dict,
                driver_users: int | None = None) -> DataFrame | pa.Table:
    """``user_id, user_index, cold, n, part``: contiguous indices in id order; a seeded cold-user
    draw; ``part``, the partition that holds the user's lists. Up to ``driver_users``
    (``DRIVER_USERS``) users, ranked on the driver and returned as an Arrow table with ``uhash``
    (``_ranked_on_driver``); beyond, positions in a Spark sort (``positions``), so no step holds
    every user in one task, returned as a persisted DataFrame. Both give the same values."""
    base = (lists.where(F.col("n_pos") > 0)
            .select("user_id", F.col("n_pos").cast("long").alias("n"), "part"))
    m = base.count()
    n_cold = int(round(cfg.cold_users * m))
    if cfg.cold_users > 0 and m - n_cold < 1:
        raise InputDataError(f"--cold-users {cfg.cold_users} leaves no training user out of {m}")
    if m <= (DRIVER_USERS if driver_users is None else driver_users):
        users, numeric = _ranked_on_driver(base, cfg.seed, n_cold)
        single = int(np.count_nonzero(users.column("n").to_numpy() == 1))
    else:
        users, numeric, single = _ranked_by_spark(base, cfg.seed, m, n_cold)
    counts.update(users=m, cold_users=n_cold, users_single_positive=single,
                  users_numeric_ids=numeric)
    progress.done("users", users=m, cold=n_cold, single_positive=single)
    return users


def _ranked_by_spark(base: DataFrame, seed: int, m: int, n_cold: int) -> tuple[DataFrame, bool, int]:
    base = base.persist(StorageLevel.MEMORY_AND_DISK)
    with small_shuffles(base.sparkSession, m):
        numeric = _all_integers(base, "user_id")
        by_id = positions(base, _order_key("user_id", numeric), "user_index")
        base.unpersist()
        # seeded sample without replacement: the n_cold users with the smallest seeded hash
        # hash of the id as read (a string), so the draw does not depend on how ids are carried
        drawn = positions(by_id, [F.xxhash64(F.lit(seed), as_str("user_id")), "user_index"],
                          "_draw")
        by_id.unpersist()
        users = (drawn.withColumn("cold", F.col("_draw") < n_cold).drop("_draw")
                 .persist(StorageLevel.MEMORY_AND_DISK))
        single = users.where(F.col("n") == 1).count()
        drawn.unpersist()
    return users, numeric, int(single)


def _ranked_on_driver(base: DataFrame, seed: int, n_cold: int) -> tuple[pa.Table, bool]:
    """``_ranked_by_spark``'s ranks from one collect: the hashes come from Spark (the same
    functions), the two orders from Arrow and numpy sorts of the same keys. Strings compare as
    bytes in both, as Spark's ``UTF8String`` does."""
    table = base.select(
        "user_id", "n", "part", F.xxhash64(F.lit(seed), as_str("user_id")).alias("draw"),
        # the rows' order in a shard (users_by_partition)
        F.xxhash64("user_id").alias("uhash")).toArrow()
    ids = table.column("user_id").combine_chunks()
    numeric = pa.types.is_integer(ids.type) or len(ids) == 0 or bool(
        pc.all(pc.match_substring_regex(ids, r"^-?[0-9]{1,18}$")).as_py())
    keys = [("id", "ascending")]
    by = {"id": ids}
    if numeric and not pa.types.is_integer(ids.type):  # as numbers; '7' and '007' by their text
        by = {"number": pc.cast(ids, pa.int64()), "id": ids}
        keys = [("number", "ascending"), ("id", "ascending")]
    order = pc.sort_indices(pa.table(by), sort_keys=keys).to_numpy()
    user_index = np.empty(len(ids), np.int32)
    user_index[order] = np.arange(len(ids), dtype=np.int32)
    # seeded sample without replacement: the n_cold users with the smallest seeded hash
    drawn = np.lexsort((user_index, table.column("draw").to_numpy()))
    cold = np.zeros(len(ids), bool)
    cold[drawn[:n_cold]] = True
    users = pa.table({"user_id": ids, "user_index": user_index, "cold": cold,
                      "n": table.column("n"), "part": table.column("part"),
                      "uhash": table.column("uhash")})
    return users, numeric


def index_items(lists: DataFrame, progress: Progress, counts: dict) -> DataFrame:
    """``item_id, item_index``: contiguous indices in id order (as numbers when all are)."""
    with small_shuffles(lists.sparkSession, counts["items_raw"]):
        base = (lists.where(F.col("n_pos") == passes.POSITIVE_ITEMS)
                .select(F.explode("items").alias("item_id")).distinct()
                .persist(StorageLevel.MEMORY_AND_DISK))
        numeric = _all_integers(base, "item_id")
        items = positions(base, _order_key("item_id", numeric), "item_index")
        n = items.count()
        base.unpersist()
    counts.update(items=n, items_numeric_ids=numeric)
    progress.done("items", items=n)
    return items


def split_rule(totals: dict, cfg: ETLConfig, counts: dict) -> passes.SplitRule:
    """How each user's positives are split: per user by time (ties: item id) or by a seeded
    permutation, the authors' arithmetic; or the split the input gave (``--split given``).
    ``totals``: positives with a time and given to each split (``user_lists``).

    Under ``--split given``, when no positive was given to validation, each user's validation is
    carved out of their given train positives with the protocol's proportions: of m train
    positives, the newest (or, without timestamps, a seeded random) floor(m (h - t) / (1 - t))
    become valid, 2/7 with the defaults, the share valid has of train+valid in the protocol's
    50/20/30 split.
    """
    t = protocol.as_fraction(cfg.test_fraction)
    h = protocol.as_fraction(cfg.holdout_fraction)
    fractions = dict(test=(t.numerator, t.denominator), holdout=(h.numerator, h.denominator))
    if cfg.split_mode != "given":
        return passes.SplitRule(cfg.split_mode, **fractions)
    given = {s: totals[f"given_{s}"] for s in S.SPLITS if totals[f"given_{s}"]}
    if not given.get("test"):
        raise InputDataError(f"--split given: no test positives (per given split: {given}); the "
                             "test file or the test rows are missing, or none is positive under "
                             f"--positive '{cfg.positive_rule}'")
    carve = not given.get("valid")
    info = {"source": "column " + cfg.split_col if cfg.split_col else "files",
            "given_positives": given, "valid": "carved from train" if carve else "given"}
    counts["given_split"] = info
    if not carve:
        return passes.SplitRule("given", **fractions)
    share = (h - t) / (1 - t)
    order = "time" if totals["timed"] else "random"
    info.update(valid_fraction_of_train=str(share), valid_order=order)
    return passes.SplitRule("given", **fractions, carve=(share.numerator, share.denominator),
                            carve_by=order)


def _split_order(mode: str, seed: int) -> list:
    """Oldest first (ties: item index), or a seeded per-user permutation."""
    if mode == "time":
        return [F.col("timestamp").asc_nulls_first(), "item_index"]
    return [F.xxhash64(F.lit(seed), as_str("user_id"), as_str("item_id")), "item_index"]


def users_by_partition(users: DataFrame | pa.Table, work: Work) -> None:
    """Write each partition's users (``user_id, user_index, cold, uhash``) beside its lists
    (``Work``): the join of the lists with the users, without moving the lists. ``users``:
    ``index_users``' result, a table the driver writes or a DataFrame the tasks do."""
    columns = ["user_id", "user_index", "cold", "uhash"]
    if isinstance(users, pa.Table):
        part = users.column("part").to_numpy()
        order = np.argsort(part, kind="stable")
        cuts = np.flatnonzero(np.diff(part[order])) + 1
        for rows in np.split(order, cuts) if len(order) else []:
            work.write("users", int(part[rows[0]]), users.select(columns).take(pa.array(rows)))
        return

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = _partition_table(batches)
        parts = [] if table is None else np.unique(table.column("part").to_numpy())
        for part in parts:
            mine = table.filter(pc.equal(table.column("part"), part)).drop_columns(["part"])
            work.write("users", int(part), mine)
        yield pa.RecordBatch.from_pydict({"parts": pa.array([len(parts)], pa.int32())})

    # uhash: the rows' order in a shard, as the split window's sort left it before etl.passes
    (users.select(*columns[:3], F.xxhash64("user_id").alias("uhash"), "part")
     .repartition(work.partitions, "part").mapInArrow(fn, "parts int").collect())


def positives_of(lists: pa.Table, side: pa.Table, items: passes.IdLookup,
                 item_index: np.ndarray, rule: passes.SplitRule) -> dict:
    """One partition's users with their lists (``lists``) and indices (``side``), in the order of
    the shards since they exist (by ``xxhash64(user_id)``, then ``user_id``), and their positives
    flat: ``row`` (the user's row of ``lists``), ``user_index, user_id, cold, lengths`` per user
    and ``item`` (raw ids), ``item_index``, ``code`` (0 train, 1 valid, 2 test), ``ts`` per
    positive."""
    lists = lists.combine_chunks()
    at = passes.IdLookup(side.column("user_id").combine_chunks(), "partition's users")(
        lists.column("user_id").chunk(0))
    order = pc.sort_indices(pa.table({"h": side.column("uhash").take(pa.array(at)),
                                      "id": lists.column("user_id")}),
                            sort_keys=[("h", "ascending"), ("id", "ascending")]).to_numpy()
    at = at[order]
    batch, p = _reordered(lists, order)
    p["item_index"] = item_index[items(p["item"])]
    extra = {c: passes.flat(batch, c) for c in ("given", "rhash") if c in lists.column_names}
    p["code"] = passes.split_codes(p["lengths"], p["item_index"], passes.as_int(p["ts"], passes.NULL_TS),
                                   extra.get("given"), extra.get("rhash"), rule)
    p.update(user_index=side.column("user_index").to_numpy()[at],
             cold=side.column("cold").to_numpy(zero_copy_only=False)[at])
    return p


def _reordered(lists: pa.Table, order: np.ndarray) -> tuple[pa.RecordBatch, dict]:
    """``lists``' users in ``order``: as one batch, and ``row, user_id, lengths`` and ``item, ts``
    flat."""
    batch = lists.take(pa.array(order)).combine_chunks().to_batches()[0]
    return batch, {"row": order, "user_id": batch.column("user_id"),
                   "lengths": batch.column("n_pos").to_numpy().astype(np.int64),
                   "item": batch.column("items").flatten(), "ts": batch.column("ts").flatten()}


def kept_split(p: dict) -> pa.Table:
    """What the split pass keeps of ``positives_of``'s result for the write pass (``Work`` kind
    "split"), so that the write pass neither looks ids up nor splits again: per user, in order,
    its row of the lists, index and cold flag, and its positives' item indices and split codes."""
    off = passes.offsets(p["lengths"])
    return pa.table({
        "row": pa.array(p["row"], pa.int32()), "user_index": pa.array(p["user_index"], pa.int32()),
        "cold": pa.array(p["cold"], pa.bool_()),
        "item_index": pa.ListArray.from_arrays(off, pa.array(p["item_index"], pa.int32())),
        "code": pa.ListArray.from_arrays(off, pa.array(p["code"], pa.int8()))})


def kept_positives(lists: pa.Table, kept: pa.Table) -> dict:
    """``positives_of``'s result again, from the partition's lists and ``kept_split``'s table."""
    kept = kept.combine_chunks()
    _, p = _reordered(lists.combine_chunks(), kept.column("row").to_numpy())
    p.update(user_index=kept.column("user_index").to_numpy(),
             cold=kept.column("cold").to_numpy(zero_copy_only=False),
             item_index=pc.list_flatten(kept.column("item_index")).to_numpy(),
             code=pc.list_flatten(kept.column("code")).to_numpy())
    return p


def split_positives(spark: SparkSession, work: Work, items: DataFrame, rule: passes.SplitRule,
                    progress: Progress, counts: dict):
    """Split every user's positives (``etl.passes.split_codes``) and count them: per split, of
    cold users, and per item of warm users in train and in train+valid (the popularity R* and
    the negatives need). Keeps each partition's split for the write pass (``kept_split``).
    Returns the item table (a pandas DataFrame on the driver): index, raw id, train and
    train+valid counts of warm users."""
    table = items.select("item_id", "item_index").toArrow()
    ids, item_index = table.column("item_id").combine_chunks(), table.column("item_index").to_numpy()
    lookup, n_items = passes.IdLookup(ids, "items"), len(ids)
    stats = ("train", "valid", "test", "cold")  # item_index -1, -2, ... in the output

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for part in b.column("part").to_pylist():
                lists = work.read("lists", part)
                if lists is None:
                    continue
                p = positives_of(lists, work.read("users", part), lookup, item_index, rule)
                work.write("split", part, kept_split(p))
                owner = np.repeat(np.arange(len(p["lengths"])), p["lengths"])
                warm = ~p["cold"][owner]
                train = np.bincount(p["item_index"][warm & (p["code"] == 0)], minlength=n_items)
                train_valid = np.bincount(p["item_index"][warm & (p["code"] <= 1)], minlength=n_items)
                seen = np.flatnonzero(train_valid)
                per = [*np.bincount(p["code"], minlength=3), int((~warm).sum())]
                cat = lambda a, b, t: pa.array(np.concatenate([a, b]).astype(t))
                yield pa.RecordBatch.from_pydict({
                    "item_index": cat(seen, -1 - np.arange(len(stats)), np.int32),
                    "train": cat(train[seen], per, np.int64),
                    "train_valid": cat(train_valid[seen], np.zeros(len(stats)), np.int64)})

    with small_shuffles(spark, n_items):
        sums = (work.tasks(spark).mapInArrow(fn, "item_index int, train long, train_valid long")
                .groupBy("item_index").agg(F.sum("train").alias("train"),
                                           F.sum("train_valid").alias("train_valid")).toArrow())
    at = sums.column("item_index").to_numpy()
    got = dict(zip(at.tolist(), sums.column("train").to_numpy().tolist()))
    per_split = {s: int(got.get(-1 - k, 0)) for k, s in enumerate(S.SPLITS)}
    cold_pos = int(got.get(-1 - stats.index("cold"), 0))
    counts["positives"] = per_split
    counts["positives_cold_users"] = cold_pos
    progress.done("split", **per_split, cold=cold_pos)

    pop = np.zeros((n_items, 2), np.int64)
    keep = at >= 0
    pop[at[keep], 0] = sums.column("train").to_numpy()[keep]
    pop[at[keep], 1] = sums.column("train_valid").to_numpy()[keep]
    order = np.argsort(item_index)
    item_table = pd.DataFrame({
        S.ITEM_INDEX: item_index[order].astype("int32"),
        S.ITEM_ID: pc.cast(ids, pa.string()).to_numpy(zero_copy_only=False)[order],
        S.POP_TRAIN: pop[item_index[order], 0], S.POP_TRAIN_VALID: pop[item_index[order], 1]})
    return item_table


def auto_partitions(cfg: ETLConfig, input_bytes: int) -> int:
    """Shuffle partitions = output shards: about 500k positives each, 4 to 400."""
    if cfg.shards:
        return cfg.shards
    est = cfg.positives if cfg.spec.layout.generated else input_bytes // 20
    return int(min(400, max(4, math.ceil(est / 500_000))))
