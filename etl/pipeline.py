"""The ETL's Spark steps, from parsed lines to a prepared directory (see ``prepared.schema``).

Each step ends in an action, so the progress log's time per step is the time of that step.
One shuffle by user id carries the whole per-user part (dedup, split, user rows): a hash
partitioning on ``user_id`` satisfies every later grouping that includes ``user_id``, so Spark adds
no further exchange of the big table; items are few and go by broadcast.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from prepared import protocol
from prepared import schema as S
from etl.config import ETLConfig, PositiveRule
from prepared.errors import InputDataError
from prepared.files import Crc32Sink, crc32_hex
from prepared.reader import filesystem
from etl.sources import parse
from etl.synthetic import synthetic_rows

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


def positive_condition(rule: PositiveRule, rating: Column) -> Column:
    if rule.all_rows:
        return F.lit(True)
    cond = rating.isNotNull()
    if rule.low is not None:
        cond &= (rating >= rule.low) if rule.low_inclusive else (rating > rule.low)
    if rule.high is not None:
        cond &= (rating <= rule.high) if rule.high_inclusive else (rating < rule.high)
    return cond


def _yahoo_checks(parsed: DataFrame) -> DataFrame:
    """Yahoo R1 ratings are integers 0-100, or 255 ("never play again"); anything else is bad."""
    r = F.col("rating")
    invalid = (F.col("kind") == "row") & ~(((r >= 0) & (r <= 100) & (r == F.floor(r))) | (r == 255))
    return parsed.withColumn("error", F.when(invalid, F.format_string(
        "rating %s in column 3 is not an integer in 0-100 or 255", F.col("rating").cast("string")))
        .otherwise(F.col("error"))).withColumn("kind", F.when(invalid, "bad").otherwise(F.col("kind")))


# Dedup key: the latest row of a pair wins, ties broken by input position. When timestamps fit
# 33 bits and positions 30 bits, (timestamp + 1) << 30 | position is one sortable long and the
# dedup is a hash aggregate (max_by); otherwise a max over a struct, which Spark sorts for.
POS_BITS = 30
TS_LIMIT = (1 << 33) - 2
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
                   counts: dict, labels: dict[str, str] | None = None) -> tuple[DataFrame, bool]:
    """Parsed rating rows ``user_id, item_id, rating, timestamp, gpos, given``; bad rows counted.
    ``labels``: each file's given split (``--split given`` with a file per split).

    Also says whether the fast dedup key fits (see ``POS_BITS``).
    """
    if cfg.spec.layout.generated:
        rows = synthetic_rows(spark, cfg.users, cfg.items, cfg.positives, cfg.seed,  # long ids
                              topics=cfg.topics, affinity=cfg.affinity, zipf=cfg.zipf)
        # generated pairs are distinct and their times are 2010-2015: the fast key fits
        return rows.select("*", F.lit(0).cast("long").alias("gpos"),
                           F.lit(None).cast("byte").alias("given")), True
    parsed = parse(spark, cfg, files, labels)
    if cfg.spec.layout.rating_255:
        parsed = _yahoo_checks(parsed)
    is_row = F.col("kind") == "row"
    stats = parsed.groupBy("kind").agg(
        F.count(F.lit(1)).alias("n"), F.min(F.when(is_row, F.col("timestamp"))).alias("ts_min"),
        F.max(F.when(is_row, F.col("timestamp"))).alias("ts_max"), F.max("gpos").alias("gpos_max"),
        F.bool_and(F.when(is_row, F.col("user_id").rlike(CANONICAL_INT))).alias("users_int"),
        F.bool_and(F.when(is_row, F.col("item_id").rlike(CANONICAL_INT))).alias("items_int"),
    ).collect()
    by_kind = {r["kind"]: r["n"] for r in stats}
    row_stats = next((r for r in stats if r["kind"] == "row"), None)
    fast = row_stats is not None and row_stats["gpos_max"] < (1 << POS_BITS) and (
        row_stats["ts_min"] is None or (row_stats["ts_min"] >= 0 and row_stats["ts_max"] <= TS_LIMIT))
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
    return parsed.where(is_row).select(*ids, "rating", "timestamp", "gpos", "given"), fast


def positives_of(rows: DataFrame, fast_key: bool, cfg: ETLConfig, partitions: int,
                 progress: Progress, counts: dict) -> tuple[DataFrame, DataFrame]:
    """Dedup (the most recent row of a pair decides), binarise.

    Returns the positives ``user_id, item_id, timestamp`` and the persisted pairs (to unpersist).
    Ties in time are broken by position in the input (the later line wins).
    """
    rule = PositiveRule.parse(cfg.positive_rule)
    by_user = rows.repartition(partitions, "user_id")
    if fast_key:
        order = F.shiftleft(F.coalesce(F.col("timestamp") + 1, F.lit(0)), POS_BITS) + F.col("gpos")
        aggs = [F.max("timestamp").alias("timestamp"), F.max_by("rating", order).alias("rating")]
    else:
        latest = F.max(F.struct(F.coalesce(F.col("timestamp"), F.lit(-(1 << 62))).alias("t"),
                                "gpos", "rating", "timestamp")).alias("latest")
        aggs = [latest]
    if cfg.split_mode == "given":
        # a pair given in two splits (a leak in the benchmark) stays in the earlier one: an item
        # a user trained on is never a test item (counted, and said in the manifest)
        aggs += [F.min("given").alias("given"), (F.min("given") != F.max("given")).alias("twice")]
    else:
        aggs += [F.lit(None).cast("byte").alias("given"), F.lit(False).alias("twice")]
    pairs = by_user.groupBy("user_id", "item_id").agg(*aggs, F.count(F.lit(1)).alias("copies"))
    if not fast_key:
        pairs = pairs.select("user_id", "item_id", F.col("latest.rating").alias("rating"),
                             F.col("latest.timestamp").alias("timestamp"), "given", "twice",
                             "copies")
    pairs = pairs.withColumn("positive", positive_condition(rule, F.col("rating")))
    pairs = pairs.persist(StorageLevel.MEMORY_AND_DISK)
    agg = pairs.agg(
        F.count(F.lit(1)).alias("pairs"), F.sum("copies").alias("rows"),
        F.sum(F.col("positive").cast("long")).alias("positives"),
        F.sum((F.col("rating") == 255).cast("long")).alias("r255"),
        F.sum(F.col("twice").cast("long")).alias("twice"),
    ).first()
    # distinct counts one column at a time: a single agg with two count_distincts expands the table
    users_raw = pairs.select("user_id").distinct().count()
    items_raw = pairs.select("item_id").distinct().count()
    n_pairs, n_pos = int(agg["pairs"]), int(agg["positives"] or 0)
    counts.update(rows=int(agg["rows"]), duplicate_rows=int(agg["rows"]) - n_pairs, pairs=n_pairs,
                  non_positive_pairs=n_pairs - n_pos, users_raw=users_raw, items_raw=items_raw)
    if cfg.spec.layout.rating_255:
        counts["rating_255_pairs"] = int(agg["r255"] or 0)
    if cfg.split_mode == "given":
        counts["pairs_in_two_splits"] = int(agg["twice"] or 0)
        if agg["twice"]:
            log.warning("%s (user, item) pairs appear in two given splits; each is kept in the "
                        "earlier one (train before valid before test)", f"{int(agg['twice']):,}")
    if n_pos == 0:
        raise InputDataError(
            f"no positives left after binarising {n_pairs:,} (user, item) pairs with --positive "
            f"'{rule}'; check the rule against the rating scale of --dataset {cfg.dataset}")
    progress.done("dedup", rows=counts["rows"], duplicates=counts["duplicate_rows"], pairs=n_pairs,
                  positives=n_pos)
    pos = pairs.where("positive").select("user_id", "item_id", "timestamp", "given")
    return pos.persist(StorageLevel.MEMORY_AND_DISK), pairs


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


def index_users(pos: DataFrame, cfg: ETLConfig, progress: Progress, counts: dict) -> DataFrame:
    """``user_id, user_index, cold, n``: contiguous indices in id order; a seeded cold-user draw.
    Both are positions in a sort (``positions``), so no step holds every user in one task."""
    base = pos.groupBy("user_id").agg(F.count(F.lit(1)).alias("n")).persist(StorageLevel.MEMORY_AND_DISK)
    numeric = _all_integers(base, "user_id")
    m = base.count()
    n_cold = int(round(cfg.cold_users * m))
    if cfg.cold_users > 0 and m - n_cold < 1:
        raise InputDataError(f"--cold-users {cfg.cold_users} leaves no training user out of {m}")
    by_id = positions(base, _order_key("user_id", numeric), "user_index")
    base.unpersist()
    # seeded sample without replacement: the n_cold users with the smallest seeded hash
    # hash of the id as read (a string), so the draw does not depend on how ids are carried
    drawn = positions(by_id, [F.xxhash64(F.lit(cfg.seed), as_str("user_id")), "user_index"], "_draw")
    by_id.unpersist()
    users = (drawn.withColumn("cold", F.col("_draw") < n_cold).drop("_draw")
             .persist(StorageLevel.MEMORY_AND_DISK))
    single = users.where(F.col("n") == 1).count()
    drawn.unpersist()
    counts.update(users=m, cold_users=n_cold, users_single_positive=int(single),
                  users_numeric_ids=numeric)
    progress.done("users", users=m, cold=n_cold, single_positive=int(single))
    return users


def index_items(pos: DataFrame, progress: Progress, counts: dict) -> DataFrame:
    """``item_id, item_index``: contiguous indices in id order (as numbers when all are)."""
    base = pos.select("item_id").distinct().persist(StorageLevel.MEMORY_AND_DISK)
    numeric = _all_integers(base, "item_id")
    items = positions(base, _order_key("item_id", numeric), "item_index")
    n = items.count()
    base.unpersist()
    counts.update(items=n, items_numeric_ids=numeric)
    progress.done("items", items=n)
    return items


def split_positives(pos: DataFrame, users: DataFrame, items: DataFrame,
                    cfg: ETLConfig, progress: Progress, counts: dict) -> DataFrame:
    """Per-user split by time (ties: item id) or by a seeded permutation, the authors' arithmetic;
    or the split the input gave (``--split given``, see ``given_labels``).

    Items are ordered by ``item_index``, which follows the id order (numeric when all ids are).
    """
    t = protocol.as_fraction(cfg.test_fraction)
    h = protocol.as_fraction(cfg.holdout_fraction)
    if cfg.split_mode == "given":
        label = given_labels(pos, cfg, counts)
    else:
        # The hash in front lets the sort compare longs, not strings; partitioning stays by user.
        by_user = [F.xxhash64("user_id"), "user_id"]
        w = Window.partitionBy(*by_user).orderBy(*_split_order(cfg.split_mode, cfg.seed))
        n = F.count(F.lit(1)).over(Window.partitionBy(*by_user))
        k = F.row_number().over(w) - 1  # 0-based, oldest first
        n_test = F.floor(n * t.numerator / t.denominator)  # exact: integer / integer of longs
        n_holdout = F.floor(n * h.numerator / h.denominator)
        label = F.when(k < n - n_holdout, "train").when(k < n - n_test, "valid").otherwise("test")
    df = (pos.join(F.broadcast(items), "item_id")
          # users by a plain join: broadcast by Spark while they are small, never forced (10^8
          # users would not fit a broadcast); the positives keep their partitioning by user
          .join(users.select("user_id", "user_index", "cold"), "user_id")
          .withColumn("split", label))
    df = df.drop("given").persist(StorageLevel.MEMORY_AND_DISK)
    per = df.groupBy("split", "cold").agg(F.count(F.lit(1)).alias("n")).collect()
    per_split = {s: sum(r["n"] for r in per if r["split"] == s) for s in S.SPLITS}
    cold_pos = sum(r["n"] for r in per if r["cold"])
    counts["positives"] = per_split
    counts["positives_cold_users"] = int(cold_pos)
    progress.done("split", **per_split, cold=int(cold_pos))
    return df


def _split_order(mode: str, seed: int) -> list:
    """Oldest first (ties: item index), or a seeded per-user permutation."""
    if mode == "time":
        return [F.col("timestamp").asc_nulls_first(), "item_index"]
    return [F.xxhash64(F.lit(seed), as_str("user_id"), as_str("item_id")), "item_index"]


def given_labels(pos: DataFrame, cfg: ETLConfig, counts: dict) -> Column:
    """The split of each positive under ``--split given``: the one the input gave it; when no
    positive was given to validation, each user's validation is carved out of their given train
    positives with the protocol's proportions: of m train positives, the newest (or, without
    timestamps, a seeded random) floor(m (h - t) / (1 - t)) become valid, 2/7 with the defaults,
    the share valid has of train+valid in the protocol's 50/20/30 split. Needs the ``item_index``
    column (joined by the caller)."""
    given = {S.SPLITS[r["given"]]: int(r["n"])
             for r in pos.groupBy("given").agg(F.count(F.lit(1)).alias("n")).collect()}
    if not given.get("test"):
        raise InputDataError(f"--split given: no test positives (per given split: {given}); the "
                             "test file or the test rows are missing, or none is positive under "
                             f"--positive '{cfg.positive_rule}'")
    t = protocol.as_fraction(cfg.test_fraction)
    h = protocol.as_fraction(cfg.holdout_fraction)
    carve = not given.get("valid")
    info = {"source": "column " + cfg.split_col if cfg.split_col else "files",
            "given_positives": given, "valid": "carved from train" if carve else "given"}
    named = F.element_at(F.array(*[F.lit(x) for x in S.SPLITS]), F.col("given").cast("int") + 1)
    if not carve:
        counts["given_split"] = info
        return named
    share = (h - t) / (1 - t)
    order = "time" if pos.where(F.col("timestamp").isNotNull()).limit(1).count() else "random"
    info.update(valid_fraction_of_train=str(share), valid_order=order)
    counts["given_split"] = info
    # a window per (user, given split): the train rows' own count and order
    by_user_split = [F.xxhash64("user_id"), "user_id", "given"]
    w = Window.partitionBy(*by_user_split).orderBy(*_split_order(order, cfg.seed))
    m = F.count(F.lit(1)).over(Window.partitionBy(*by_user_split))
    k = F.row_number().over(w) - 1
    n_valid = F.floor(m * share.numerator / share.denominator)
    return F.when((F.col("given") == 0) & (k >= m - n_valid), F.lit("valid")).otherwise(named)


def popularity(split: DataFrame, items: DataFrame, progress: Progress):
    """Item table (a pandas DataFrame on the driver): index, raw id, train and train+valid
    counts of warm users."""
    warm = split.where(~F.col("cold"))
    pop = warm.groupBy("item_index").agg(
        F.sum((F.col("split") == "train").cast("long")).alias(S.POP_TRAIN),
        F.sum(F.col("split").isin("train", "valid").cast("long")).alias(S.POP_TRAIN_VALID))
    table = (items.join(pop, "item_index", "left").fillna(0, [S.POP_TRAIN, S.POP_TRAIN_VALID])
             .select("item_index", as_str("item_id"), S.POP_TRAIN, S.POP_TRAIN_VALID)
             .orderBy("item_index").toPandas())
    table = table[[S.ITEM_INDEX, S.ITEM_ID, S.POP_TRAIN, S.POP_TRAIN_VALID]]
    table[S.ITEM_INDEX] = table[S.ITEM_INDEX].astype("int32")
    table[S.POP_TRAIN] = table[S.POP_TRAIN].astype("int64")
    table[S.POP_TRAIN_VALID] = table[S.POP_TRAIN_VALID].astype("int64")
    progress.done("popularity", items_without_train=int((table[S.POP_TRAIN] == 0).sum()))
    return table


ROWS_SCHEMA = pa.schema([
    (S.USER_INDEX, pa.int32()), (S.USER_ID, pa.string()), (S.COLD, pa.bool_()),
    (S.TRAIN_ITEMS, pa.list_(pa.int32())), (S.TRAIN_RSTAR, pa.list_(pa.float32())),
    (S.VALID_ITEMS, pa.list_(pa.int32())), (S.TEST_ITEMS, pa.list_(pa.int32())),
    (S.NEG_ITEMS, pa.list_(pa.int32())), (S.NEG_COUNTS, pa.list_(pa.int32())),
])
SPLIT_CODE = {name: code for code, name in enumerate(S.SPLITS)}


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
    order = np.lexsort((item, code, owner))  # by user, then split, then item
    item, code, owner = item[order], code[order], owner[order]
    per = np.bincount(owner * 3 + code, minlength=n_users * 3).reshape(n_users, 3)
    start = np.zeros(n_users * 3 + 1, np.int64)
    np.cumsum(per.ravel(), out=start[1:])
    lists = []
    for c in range(3):
        # positions of split c: for user u, [start[3u + c], start[3u + c + 1])
        lo, hi = start[np.arange(n_users) * 3 + c], start[np.arange(n_users) * 3 + c + 1]
        lists.append((_offsets(hi - lo), item[_ranges(lo, hi)].astype(np.int32)))
    users = user[first]
    cold = batch.column("cold").to_numpy(zero_copy_only=False)[first]
    warm = np.flatnonzero(~cold)
    off, neg_items, neg_counts = protocol.negative_counts(users[warm], pop, negatives, seed, table)
    per_user = np.zeros(n_users, np.int64)
    per_user[warm] = np.diff(off)
    neg_off = _offsets(per_user)
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


def _offsets(lengths: np.ndarray) -> pa.Array:
    out = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=out[1:])
    return pa.array(out, pa.int32())


def _rows_fn(rstar_item: np.ndarray, pop: np.ndarray, negatives: int, seed: int):
    """``mapInArrow`` function: user-contiguous positives in, user rows out.

    Arrow batches cut through users; the last (possibly incomplete) user of a batch is carried
    into the next one, so every user is built from all of its rows.
    """
    table = protocol.alias_table(pop) if negatives else None

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        carry = None
        for b in batches:
            if b.num_rows == 0:
                continue
            if carry is not None:
                b = pa.Table.from_batches([carry, b]).combine_chunks().to_batches()[0]
            users = b.column("user_index").to_numpy(zero_copy_only=False)
            others = np.flatnonzero(users != users[-1])
            last = int(others[-1]) + 1 if len(others) else 0  # rows before the batch's last user
            carry = b.slice(last)
            if last:
                yield build_rows(b.slice(0, last), rstar_item, pop, negatives, seed, table)
        if carry is not None and carry.num_rows:
            yield build_rows(carry, rstar_item, pop, negatives, seed, table)

    return fn


def _write_rows_fn(out_dir: str, rstar_item: np.ndarray, pop: np.ndarray, negatives: int, seed: int):
    """``mapInArrow`` function: build a partition's user rows and write them as one Parquet shard.

    The rows are written by pyarrow from the worker: handing ~1e9 list elements (the negatives at
    Yahoo scale) back to the JVM only to write them costs more than the whole rest of the step.
    A retried task rewrites the same deterministic file name; the directory is published whole.
    Each shard's CRC-32 is computed as its bytes are written, for the manifest.
    """
    build = _rows_fn(rstar_item, pop, negatives, seed)

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        fs, root = filesystem(out_dir)
        part = TaskContext.get().partitionId()
        path = f"{root}/part-{part:05d}.parquet"
        n_users, pending, buffered = 0, 0, []
        sink = Crc32Sink(fs.open_output_stream(path))
        try:  # the writer leaves a file object it was given open
            with pq.ParquetWriter(sink, ROWS_SCHEMA, compression="zstd") as w:
                for rows in build(batches):
                    buffered.append(rows)
                    n_users += rows.num_rows
                    pending += rows.nbytes
                    if pending > 64 << 20:  # ~64 MiB row groups
                        w.write_table(pa.Table.from_batches(buffered))
                        pending, buffered = 0, []
                if buffered:
                    w.write_table(pa.Table.from_batches(buffered))
        finally:
            sink.close()
        n_bytes = fs.get_file_info(path).size
        yield pa.RecordBatch.from_pydict({"shard": [path.rsplit("/", 1)[1]], "users": [n_users],
                                          "bytes": [n_bytes], "crc32": [crc32_hex(sink.crc)]})

    return fn


def write_user_rows(split: DataFrame, out_dir: str, rstar_item: np.ndarray, pop: np.ndarray,
                    cfg: ETLConfig) -> list[dict]:
    """Write one Parquet shard of user rows per partition of ``split`` (see ``prepared.schema``).

    ``split`` comes out of the split window with each user's positives adjacent in its partition,
    so the rows are built in one streaming Python pass: no aggregation, no further sort.
    Returns one ``{shard, users, bytes, crc32}`` per shard.
    """
    fs, root = filesystem(out_dir)
    fs.create_dir(root, recursive=True)
    codes = F.lit(None)
    for name, code in SPLIT_CODE.items():
        codes = F.when(F.col("split") == name, code).otherwise(codes)
    positives = split.select("user_index", as_str("user_id"), "cold", "item_index",
                             codes.cast("byte").alias("split_code"))
    fn = _write_rows_fn(out_dir, rstar_item, pop, cfg.negatives, cfg.seed)
    shards = positives.mapInArrow(fn, "shard string, users long, bytes long, crc32 string").collect()
    return sorted((r.asDict() for r in shards), key=lambda r: r["shard"])


def write_users(users: DataFrame, out_dir: str, partitions: int, n_users: int) -> int:
    """Write the users table (``prepared.schema``): ``users_files`` Parquet files, a range of
    user indices each, sorted within, and file k's range before file k+1's (Spark names them
    part-00000, part-00001, ... in partition order), so a reader of the directory in file-name
    order (pyarrow, pandas) still gets the rows sorted by user index, as from the single file
    this table was before; the write runs in that many tasks, not one. Returns the file count."""
    files = users_files(n_users, partitions)
    (users.select(S.USER_INDEX, as_str(S.USER_ID), S.COLD)
     .repartitionByRange(files, S.USER_INDEX).sortWithinPartitions(S.USER_INDEX)
     .write.parquet(out_dir))
    return files


#: users per file of the users table: 1.88M users (Yahoo) write 8 files of about 4 MiB
USERS_PER_FILE = 1 << 18


def users_files(n_users: int, partitions: int) -> int:
    """Files (and write tasks) of the users table: about ``USERS_PER_FILE`` users each, at least
    one, at most one per shuffle partition. (An explicit count: ``repartitionByRange(n)`` keeps
    exactly n partitions, where a bare ``orderBy`` would write one small file per shuffle
    partition, 98 at the Yahoo scale.)"""
    return max(1, min(partitions, math.ceil(n_users / USERS_PER_FILE)))


def auto_partitions(cfg: ETLConfig, input_bytes: int) -> int:
    """Shuffle partitions = output shards: about 500k positives each, 4 to 400."""
    if cfg.shards:
        return cfg.shards
    est = cfg.positives if cfg.spec.layout.generated else input_bytes // 20
    return int(min(400, max(4, math.ceil(est / 500_000))))
