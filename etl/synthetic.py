"""Synthetic one-class data with power-law popularity and learnable latent structure.

The generative model (all draws seeded; a user's data depend only on (seed, user id)):

- items belong to one of ``K`` topics (item j: topic j mod K; ``--topics``, by default one per
  40 items up to 50) and have a Zipf weight ``w_j = (rank_j + 1) ** -alpha`` (``--zipf``) over a
  seeded random rank, so popularity is power-law and popular items are spread over all topics;
- a user has one topic and a number of positives drawn from a log-normal with the requested mean
  (at least 1, at most half the catalog);
- each positive comes, with probability ``affinity`` (``--affinity``), from the user's topic (by w
  within the topic), else from the whole catalog (by w): a model that learns the topics beats
  popularity. The defaults make an easy set (most of a user's items in one of 50 topics); many
  small topics, a low affinity and a flatter Zipf make a hard one, where popularity is weak and a
  model must learn many small clusters from few positives each (issue 32's collapse study);
- timestamps: a user's interactions follow a random start time with exponential gaps.

Users are generated in fixed blocks of ``BLOCK`` ids inside Spark (``mapInArrow`` over
``spark.range``), never on the driver, so the Yahoo scale (1.88M users, 49M positives) fits.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import functions as F

from prepared.protocol import alias_table

BLOCK = 4096
ALPHA = 1.0
AFFINITY = 0.8
T0 = 1_262_304_000  # 2010-01-01
SPAN = 5 * 365 * 86_400
MEAN_GAP = 86_400.0

# Ids leave Python as longs and become strings in the JVM: much cheaper than Arrow strings.
SCHEMA = "user long, item long, timestamp long"


def n_topics(n_items: int, topics: int = 0) -> int:
    """``topics`` where given (at most one per item), else one per 40 items, 2 to 50."""
    if topics:
        return int(min(topics, n_items))
    return int(min(50, max(2, n_items // 40)))


class Catalog:
    """Item weights as alias tables (global, and one per topic) for O(1) vectorised draws."""

    def __init__(self, n_items: int, seed: int, topics: int = 0, affinity: float = AFFINITY,
                 zipf: float = ALPHA):
        rng = np.random.default_rng([seed, 0xC0FFEE])
        rank = rng.permutation(n_items)
        self.weight = (rank + 1.0) ** -zipf
        self.affinity = affinity
        self.k = n_topics(n_items, topics)
        self.topic = np.arange(n_items) % self.k
        self.g_prob, self.g_alias = alias_table(self.weight)
        probs, items, aliases, sizes = [], [], [], []
        for t in range(self.k):
            ix = np.flatnonzero(self.topic == t)
            p, a = alias_table(self.weight[ix])
            probs.append(p), items.append(ix), aliases.append(ix[a]), sizes.append(len(ix))
        self.t_prob, self.t_item = np.concatenate(probs), np.concatenate(items)
        self.t_alias = np.concatenate(aliases)
        self.t_size = np.array(sizes)
        self.t_start = np.concatenate([[0], np.cumsum(self.t_size)[:-1]])

    def draw(self, rng: np.random.Generator, topics: np.ndarray) -> np.ndarray:
        """One item per entry of ``topics`` (a user's topic per draw)."""
        n = len(topics)
        u, v = rng.random(n), rng.random(n)
        slot = (u * len(self.weight)).astype(np.int64)
        out = np.where(v < self.g_prob[slot], slot, self.g_alias[slot])
        local = rng.random(n) < self.affinity
        tslot = self.t_start[topics] + (u * self.t_size[topics]).astype(np.int64)
        within = np.where(v < self.t_prob[tslot], self.t_item[tslot], self.t_alias[tslot])
        return np.where(local, within, out)


def first_occurrences(keys: np.ndarray) -> np.ndarray:
    """``np.unique(keys, return_index=True)[1]`` for non-negative int64 keys: each distinct key's
    first position, in key order. One plain sort of (key, position) packed in an int64 instead of
    a stable argsort: 3x faster at a block's 282k draws (AVX-512 sort), a third of the
    generator's time."""
    n = len(keys)
    shift = max(1, n.bit_length())
    if n == 0 or int(keys.max()) >= 1 << (63 - shift):
        return np.unique(keys, return_index=True)[1]
    packed = np.sort((keys << shift) | np.arange(n, dtype=np.int64))
    key = packed >> shift
    head = np.ones(n, bool)
    head[1:] = key[1:] != key[:-1]
    return packed[head] & ((1 << shift) - 1)


def generate_block(block: int, n_users: int, n_items: int, mean_positives: float, seed: int,
                   catalog: Catalog) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(users, items, timestamps) int64 arrays for the user ids of block ``block``."""
    rng = np.random.default_rng([seed, block])
    users = np.arange(block * BLOCK, min((block + 1) * BLOCK, n_users), dtype=np.int64)
    sigma = 1.0
    mu = np.log(max(mean_positives, 1.0)) - sigma ** 2 / 2
    want = np.clip(np.rint(rng.lognormal(mu, sigma, len(users))), 1, max(1, n_items // 2))
    want = want.astype(np.int64)
    topic = rng.integers(0, catalog.k, len(users))
    # Draw with replacement, topping up users still short of distinct items (small topics repeat
    # their head items often), then keep each user's first `want` distinct items in draw order.
    owner = np.zeros(0, np.int64)
    items = np.zeros(0, np.int64)
    short = np.arange(len(users))
    deficit = want
    for _ in range(3):
        draws = np.ceil(deficit * 2.5).astype(np.int64) + 4
        new_owner = np.repeat(short, draws)
        owner = np.concatenate([owner, new_owner])
        items = np.concatenate([items, catalog.draw(rng, topic[new_owner])])
        first = first_occurrences(owner * np.int64(n_items) + items)
        have = np.bincount(owner[first], minlength=len(users))
        short = np.flatnonzero(have < want)
        if len(short) == 0:
            break
        deficit = want[short] - have[short]
    first = first[np.lexsort((first, owner[first]))]  # grouped by user, draw order within
    owner_u = owner[first]
    start = np.concatenate([[0], np.flatnonzero(np.diff(owner_u)) + 1])
    run = np.arange(len(first)) - np.repeat(start, np.diff(np.append(start, len(first))))
    keep = first[run < want[owner_u]]
    owner_k, items_k = owner[keep], items[keep]
    gaps = rng.exponential(MEAN_GAP, len(keep))
    begin = T0 + rng.integers(0, SPAN, len(users))
    # cumulative gaps restart at each user
    csum = np.cumsum(gaps)
    firsts = np.concatenate([[0], np.flatnonzero(np.diff(owner_k)) + 1])
    base = np.repeat(csum[firsts] - gaps[firsts], np.diff(np.append(firsts, len(keep))))
    ts = begin[owner_k] + (csum - base).astype(np.int64)
    return users[owner_k], items_k.astype(np.int64), ts


def generator(n_users: int, n_items: int, n_positives: int, seed: int, **shape):
    """The ``mapInArrow`` function: batches of block ids in, batches of rows out. ``shape``:
    Catalog's topics, affinity and zipf."""
    mean = n_positives / n_users

    def gen(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        catalog = Catalog(n_items, seed, **shape)
        for batch in batches:
            for block in batch.column(0).to_numpy():
                users, items, ts = generate_block(int(block), n_users, n_items, mean, seed, catalog)
                yield pa.RecordBatch.from_arrays(
                    [pa.array(users), pa.array(items), pa.array(ts, pa.int64())],
                    names=["user", "item", "timestamp"])

    return gen


def _blocks(spark, n_users: int):
    """One row per block of ``BLOCK`` users, so a block is generated exactly once whatever the
    partitioning, and the data depend only on the seed."""
    n_blocks = -(-n_users // BLOCK)
    parts = min(n_blocks, max(2 * spark.sparkContext.defaultParallelism, n_blocks // 8))
    return spark.range(0, n_blocks, numPartitions=parts)


def synthetic_rows(spark, n_users: int, n_items: int, n_positives: int, seed: int, **shape):
    """A DataFrame ``user_id, item_id`` (long), ``rating`` (null), ``timestamp``, made on the executors.
    ``shape``: Catalog's topics, affinity and zipf (defaults: the easy set)."""
    rows = _blocks(spark, n_users).mapInArrow(
        generator(n_users, n_items, n_positives, seed, **shape), SCHEMA)
    # ids stay longs: the pipeline carries canonical integer ids as longs anyway
    return rows.select(F.col("user").alias("user_id"), F.col("item").alias("item_id"),
                       F.lit(None).cast("double").alias("rating"), "timestamp")


def synthetic_maps(spark, root: str, partitions: int, n_users: int, n_items: int,
                   n_positives: int, seed: int, **shape) -> list[int]:
    """``synthetic_rows`` with ``etl.pipeline.read_validated``'s columns (``gpos`` 0, ``given``
    null), written as the shuffle's map files (``etl.shuffle``) by the tasks that generate them:
    rows born in Python go to the files without a trip through the JVM and back. Returns the
    map ids."""
    from etl import shuffle

    gen = generator(n_users, n_items, n_positives, seed, **shape)

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        made = [b for b in gen(batches) if b.num_rows]
        if not made:
            return
        t = pa.Table.from_batches(made)
        n = t.num_rows
        table = pa.table({"user_id": t.column("user"), "item_id": t.column("item"),
                          "rating": pa.nulls(n, pa.float64()), "timestamp": t.column("timestamp"),
                          "gpos": pa.array(np.zeros(n, np.int64)), "given": pa.nulls(n, pa.int8())})
        part = shuffle.partition_of(table.column("user_id").to_numpy(), partitions)
        yield shuffle.task_map(root, partitions, table, part)

    return shuffle.map_ids(_blocks(spark, n_users).mapInArrow(fn, shuffle.MAP_SCHEMA))
