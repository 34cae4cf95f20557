"""Ray Data pipelines over the user-row shards, and Arrow batches -> sparse torch batches.

Only the columns a model needs are read (at Yahoo scale the negatives are 80% of the bytes and
AutoRec never reads them). Cold-start users never reach training or validation.

    training:   warm users; their train items (train + valid items for the final retraining),
                R* (stored, or from the per-item table for another beta / the final retraining),
                negatives (the ETL's, or drawn per epoch from the training popularity)
    validation: warm users with a validation item; each worker reads and scores its own share
                (``training.ingest``), so every user counts exactly once
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from models.base import NEGATIVES, RSTAR
from models.batch import Batch, flat
from prepared import protocol
from prepared import schema as S


@dataclass(frozen=True)
class FeedPlan:
    """What the batches of one run hold and where each part comes from."""

    needs_rstar: bool
    needs_negatives: bool
    merge_valid: bool                  # final retraining: input = train + valid items
    rstar_item: np.ndarray | None      # per-item R* to gather (None: the stored column)
    neg_popularity: np.ndarray | None  # draw negatives from this (None: the ETL's counts)
    num_negatives: int
    seed: int

    def columns(self) -> list[str]:
        cols = [S.USER_INDEX, S.TRAIN_ITEMS]
        if self.merge_valid:
            cols.append(S.VALID_ITEMS)
        if self.needs_rstar and self.rstar_item is None:
            cols.append(S.TRAIN_RSTAR)
        if self.needs_negatives and self.neg_popularity is None:
            cols += [S.NEG_ITEMS, S.NEG_COUNTS]
        return cols


def plan(model_cls, prep, cfg) -> FeedPlan:
    """The FeedPlan of ``cfg`` (a TrainConfig) for a model of class ``model_cls`` (what its
    batches need: ``Recommender.needs``) on ``prep`` (a Prepared)."""
    tv = cfg.final_retraining
    needs_rstar = RSTAR in model_cls.needs
    needs_negatives = NEGATIVES in model_cls.needs
    rstar = None
    if needs_rstar and not prep.rstar_is_stored(cfg.beta, tv):
        rstar = prep.rstar_table(cfg.beta if cfg.beta is not None else prep.beta(), tv)
    resample = needs_negatives and (cfg.negatives == "resample" or tv
                                    or (cfg.num_negatives or prep.negatives()) != prep.negatives())
    return FeedPlan(
        needs_rstar=needs_rstar, needs_negatives=needs_negatives, merge_valid=tv,
        rstar_item=rstar,
        neg_popularity=(prep.pop_train_valid if tv else prep.pop_train) if resample else None,
        num_negatives=cfg.num_negatives or prep.negatives(), seed=cfg.seed)


def fits_in_object_store(rows_uri: str, cache: str,
                         reads: dict[str, tuple[list[str], float]]) -> dict[str, bool]:
    """For each dataset of ``reads`` (name: the columns it reads, the fraction of the users it
    keeps: a validation sample), whether to read it once into the object store: asked for, or
    ``auto`` and its Parquet bytes, uncompressed (``column_bytes``), fit in a quarter of the
    cluster's object store. By the columns read, not the files: at the Yahoo shape NCE-AutoRec
    reads 15% of them (the negatives are the rest), and streaming those 15% every epoch cost
    14 s an epoch more than reading them once (benchmarks/results/yahoo_scale.md). The files'
    footers are read once for all the datasets."""
    if cache != "auto":
        return dict.fromkeys(reads, cache == "memory")
    import ray

    sizes = column_bytes(rows_uri)
    room = ray.cluster_resources().get("object_store_memory", 0) / 4
    return {name: fraction * sum(sizes.get(c, 0) for c in {*columns, S.COLD}) < room
            for name, (columns, fraction) in reads.items()}


def column_bytes(rows_uri: str) -> dict[str, int]:
    """The uncompressed Parquet bytes of each column of the user-row shards (a list column's
    leaf ``name.list.element`` counted under ``name``), from the files' footers (no data read):
    about their Arrow size for the ETL's plain-encoded lists."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    from prepared.uri import filesystem

    fs, path = filesystem(rows_uri)
    sizes: dict[str, int] = {}
    for f in pads.dataset(path, filesystem=fs, format="parquet").files:
        meta = pq.read_metadata(f, filesystem=fs)
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for j in range(group.num_columns):
                name = group.column(j).path_in_schema.split(".")[0]
                sizes[name] = sizes.get(name, 0) + group.column(j).total_uncompressed_size
    return sizes


def _warm_rows(rows_uri: str, columns: list[str]):
    """Warm users' rows, ``columns`` only (the predicate is pushed into the Parquet read)."""
    import ray.data
    from ray.data.expressions import col

    ds = ray.data.read_parquet(rows_uri, columns=[*columns, S.COLD])
    return ds.filter(expr=col(S.COLD) == False)  # noqa: E712 (an expression, not a comparison)


def _warm_tables(rows_uri: str, columns: list[str]) -> list[pa.Table]:
    """``_warm_rows`` read in this process, for small data (``fits_in_object_store``): a table
    per file, in the order Ray Data reads them, so that the shares and the seeded shuffles are a
    Ray Data read's (one block per file). Its read and ``materialize`` schedule tasks: 2-3 s for
    a MovieLens set's two datasets on 2 cores, before the first epoch and more than its
    training."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    from prepared.uri import filesystem

    fs, path = filesystem(rows_uri)
    return [pq.read_table(f, filesystem=fs, columns=[*columns, S.COLD],
                          filters=[(S.COLD, "==", False)]).combine_chunks()
            for f in sorted(pads.dataset(path, filesystem=fs, format="parquet").files)]


def _dataset(tables: list[pa.Table]):
    import ray.data

    return ray.data.from_arrow(tables)


def train_dataset(rows_uri: str, feed: FeedPlan, here: bool = False):
    """The training rows as a Ray dataset; ``here``: read in this process (small data), already
    materialized."""
    if here:
        return _dataset(_warm_tables(rows_uri, feed.columns()))
    return _warm_rows(rows_uri, feed.columns())


#: what validation reads of each warm user's row
VALID_COLUMNS = [S.USER_INDEX, S.TRAIN_ITEMS, S.VALID_ITEMS]


def valid_dataset(rows_uri: str, fraction: float = 1.0, here: bool = False):
    """The validation users' rows; with ``fraction`` < 1 only the fixed subset
    ``in_valid_sample`` keeps (the same users every epoch and every run). ``here``: as
    ``train_dataset``'s."""
    keep = lambda rows: rows.filter(in_valid_sample(rows.column(S.USER_INDEX).to_numpy(),
                                                    fraction))
    if here:
        tables = _warm_tables(rows_uri, VALID_COLUMNS)
        return _dataset([keep(t) for t in tables] if fraction < 1 else tables)
    ds = _warm_rows(rows_uri, VALID_COLUMNS)
    return ds if fraction >= 1 else ds.map_batches(keep, batch_format="pyarrow")


def in_valid_sample(users: np.ndarray, fraction: float) -> np.ndarray:
    """Which users (by index) a validation sample of ``fraction`` keeps: a hash of the index
    (splitmix64's finaliser) against the fraction, so the subset is fixed, spread over the whole
    index range (indices follow the ids' order, which may carry meaning) and nested (a smaller
    fraction keeps a subset of a larger one's users)."""
    if fraction >= 1:
        return np.ones(len(users), bool)
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
        x = protocol.splitmix64(users.astype(np.uint64))
    return (x >> np.uint64(11)) < np.uint64(int(fraction * (1 << 53)))


def batch_from_arrow(rows: pa.Table | pa.RecordBatch) -> Batch:
    """A Batch from user rows with the columns of ``prepared.schema.ROW_COLUMNS`` (stored R* and
    negatives), as the ETL wrote them."""
    train, train_off = flat(rows.column(S.TRAIN_ITEMS))
    rstar, _ = flat(rows.column(S.TRAIN_RSTAR))
    neg, neg_off = flat(rows.column(S.NEG_ITEMS))
    counts, _ = flat(rows.column(S.NEG_COUNTS))
    t = lambda a, dt: torch.from_numpy(np.array(a, dtype=dt))  # a copy: Arrow buffers are read-only
    return Batch(users=t(rows.column(S.USER_INDEX).to_numpy(zero_copy_only=False), np.int64),
                 train_items=t(train, np.int64), train_offsets=t(train_off, np.int64),
                 train_rstar=t(rstar, np.float32), neg_items=t(neg, np.int64),
                 neg_counts=t(counts, np.int64), neg_offsets=t(neg_off, np.int64))


def union_sorted(a_vals, a_off, b_vals, b_off, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the sorted concatenation of two disjoint sparse rows (train and valid items)."""
    rows = np.concatenate([_rows(a_off, len(a_vals)), _rows(b_off, len(b_vals))])
    vals = np.concatenate([a_vals, b_vals]).astype(np.int64)
    order = np.lexsort((vals, rows))
    counts = np.bincount(rows, minlength=n_rows)
    off = np.zeros(n_rows, np.int64)
    np.cumsum(counts[:-1], out=off[1:])
    return vals[order], off


def _rows(offsets: np.ndarray, nnz: int) -> np.ndarray:
    lengths = np.diff(np.append(offsets, nnz))
    return np.repeat(np.arange(len(offsets)), lengths)


def epoch_seed(seed: int, epoch: int) -> int:
    """A per-epoch seed for resampled negatives (a pure function of the run's seed and epoch)."""
    return int(protocol.random_bits(seed, np.array([epoch]), 1)[0, 0] >> np.uint64(1))


class BatchMaker:
    """Arrow user rows -> Batch, following a FeedPlan (one per worker: it caches the alias table)."""

    def __init__(self, feed: FeedPlan):
        self.feed = feed
        self.table = (protocol.alias_table(feed.neg_popularity)
                      if feed.neg_popularity is not None else None)

    def __call__(self, rows: pa.Table, epoch: int) -> Batch:
        f = self.feed
        t = lambda a, dt: torch.from_numpy(np.array(a, dtype=dt))  # a copy: Arrow memory is read-only
        users = rows.column(S.USER_INDEX).to_numpy(zero_copy_only=False).astype(np.int64)
        items, off = flat(rows.column(S.TRAIN_ITEMS))
        if f.merge_valid:
            v_items, v_off = flat(rows.column(S.VALID_ITEMS))
            items, off = union_sorted(items, off, v_items, v_off, len(users))
        if not f.needs_rstar:
            rstar = np.zeros(0, np.float32)
        elif f.rstar_item is not None:
            rstar = f.rstar_item[items]
        else:
            rstar, _ = flat(rows.column(S.TRAIN_RSTAR))
        if not f.needs_negatives:
            neg, counts, neg_off = np.zeros(0), np.zeros(0), np.zeros(len(users))
        elif self.table is not None:
            o, neg, counts = protocol.negative_counts(users, f.neg_popularity, f.num_negatives,
                                                      epoch_seed(f.seed, epoch), self.table)
            neg_off = o[:-1]
        else:
            neg, neg_off = flat(rows.column(S.NEG_ITEMS))
            counts, _ = flat(rows.column(S.NEG_COUNTS))
        return Batch(users=t(users, np.int64), train_items=t(items, np.int64),
                     train_offsets=t(off, np.int64), train_rstar=t(rstar, np.float32),
                     neg_items=t(neg, np.int64), neg_counts=t(counts, np.int64),
                     neg_offsets=t(neg_off, np.int64))


@dataclass
class ValidBatch:
    train_items: torch.Tensor
    train_offsets: torch.Tensor
    valid_items: torch.Tensor
    valid_offsets: torch.Tensor
    users: torch.Tensor | None = None  # the users' indices (for models that validate by them)

    def __len__(self) -> int:
        return len(self.train_offsets)

    def to(self, device: torch.device) -> ValidBatch:
        return ValidBatch(*(x.to(device, non_blocking=True) if x is not None else None for x in
                            (self.train_items, self.train_offsets, self.valid_items,
                             self.valid_offsets, self.users)))


def valid_batch(rows: pa.Table, rank: int, world: int) -> ValidBatch | None:
    """This worker's users of ``rows`` that have a validation item (None if there are none)."""
    users = rows.column(S.USER_INDEX).to_numpy(zero_copy_only=False)
    n_valid = pc.list_value_length(rows.column(S.VALID_ITEMS)).fill_null(0).to_numpy()
    keep = (users % world == rank) & (n_valid > 0)
    if not keep.any():
        return None
    rows = rows.filter(pa.array(keep))
    t = lambda a: torch.from_numpy(np.array(a, dtype=np.int64))
    items, off = flat(rows.column(S.TRAIN_ITEMS))
    v_items, v_off = flat(rows.column(S.VALID_ITEMS))
    return ValidBatch(t(items), t(off), t(v_items), t(v_off), t(users[keep]))
